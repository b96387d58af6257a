"""The planner: table specs + topology -> ShardingPlan (pure Python, no GPU, no nn.Module)."""
