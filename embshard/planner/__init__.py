"""The planner: table specs + topology -> ShardingPlan (pure Python, no GPU, no nn.Module)."""

from embshard.planner.api import PlanInfeasibleError, evaluate, manual_plan, plan
from embshard.planner.plan import ShardingPlan, TablePlacement
from embshard.planner.types import Constraints, ShardingType, TableConstraint

__all__ = ["PlanInfeasibleError", "evaluate", "manual_plan", "plan", "ShardingPlan", "TablePlacement",
           "Constraints", "ShardingType", "TableConstraint"]
