"""The runtime and training benchmarks' multi-host mode (--hosts H --ranks-per-host L --link-gbit G), in process:
its flags, its defaults, its report and where the report goes. No namespaces are made here."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import pytest

from embshard.emulated_hosts import EmulationUnavailable

SHAPING = "tbf 2 Gbit/s each way per host link, netem delay 0.1 ms each way"


@pytest.fixture(scope="module")
def local_ranks(load_benchmark):
    return load_benchmark("local_ranks")


@pytest.fixture(scope="module")
def runtime(load_benchmark):
    return load_benchmark("runtime_vs_torchrec")


@pytest.fixture(scope="module")
def train(load_benchmark):
    return load_benchmark("train_throughput")


def parse(local_ranks, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    local_ranks.add_hosts_arguments(parser)
    return parser.parse_args(argv)


def test_the_host_flags_read_as_plans_measured_reads_them(local_ranks):
    Hosts = local_ranks.Hosts
    assert local_ranks.hosts_of(parse(local_ranks), 2) == Hosts(1, 2)
    assert not Hosts(1, 2).emulated
    two = local_ranks.hosts_of(parse(local_ranks, "--hosts", "2"), 2)
    assert two == Hosts(2, 2, 2.0, 0.1) and two.emulated and two.world_size == 4
    assert local_ranks.hosts_of(parse(local_ranks, "--hosts", "3", "--ranks-per-host", "1", "--link-gbit", "0.5",
                                      "--delay-ms", "0"), 2) == Hosts(3, 1, 0.5, 0.0)


@pytest.mark.parametrize("argv, says", [
    (("--hosts", "1"), "--hosts 1: the multi-host mode needs at least 2 emulated hosts"),
    (("--hosts", "0", "--link-gbit", "2"), "--hosts 0: the multi-host mode needs at least 2"),
    (("--link-gbit", "1", "--ranks-per-host", "2"), "--ranks-per-host, --link-gbit without --hosts"),
    (("--hosts", "2", "--link-gbit", "0"), "--link-gbit 0"),
    (("--hosts", "2", "--ranks-per-host", "0"), "--ranks-per-host 0"),
])
def test_bad_host_flags_say_which_and_how_to_fix(local_ranks, argv, says):
    with pytest.raises(ValueError, match="^" + says):
        local_ranks.hosts_of(parse(local_ranks, *argv), 2)


@pytest.mark.parametrize("bench", ["runtime", "train"])
def test_bad_input_and_no_root_exit_2_with_one_line(bench, request, monkeypatch, capsys):
    module = request.getfixturevalue(bench)
    prog = f"{module.__name__}.py"
    monkeypatch.setattr(sys, "argv", [prog, "--hosts", "1"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith(f"{prog}: error: --hosts 1: ")

    def no_namespaces(*args, **kwargs):
        raise EmulationUnavailable("`ip netns add embshard-1-0-sw` failed: Operation not permitted")
    monkeypatch.setattr(module, "run_ranks", no_namespaces)
    monkeypatch.setattr(sys, "argv", [prog, "--hosts", "2", "--quick"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"{prog}: error: no emulated hosts here (--hosts needs root, ip and tc): `ip netns add")


def settings_of(module, local_ranks, *argv: str) -> dict:
    parser = argparse.ArgumentParser()
    for flag in ("--only",):
        parser.add_argument(flag, default="")
    for flag in ("--steps", "--batch", "--iters", "--rounds", "--repeats", "--warmup"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--quick", action="store_true")
    local_ranks.add_hosts_arguments(parser)
    args = parser.parse_args(argv)
    if args.batch is None and module.__name__ == "train_throughput":
        args.batch = 0
    return module.settings(args, local_ranks.hosts_of(args, 2))


def test_configurations_take_turns_in_a_new_seeded_order_each_round(local_ranks):
    configs = ("a", "b", "c", "d")
    seen = list(local_ranks.turns(configs, 6))
    rounds = [tuple(seen[i:i + 4]) for i in range(0, len(seen), 4)]
    assert len(rounds) == 6 and all(sorted(r) == list(configs) for r in rounds)
    assert len(set(rounds)) > 1 and list(local_ranks.turns(configs, 6)) == seen  # new orders, the same on every rank


def test_the_ranks_malloc_keeps_freed_memory_unless_told(local_ranks):
    parser = argparse.ArgumentParser()
    local_ranks.add_malloc_argument(parser)
    assert local_ranks.malloc_env(parser.parse_args([]).malloc) == {"GLIBC_TUNABLES": local_ranks.MALLOC_TUNABLES}
    assert local_ranks.malloc_env(parser.parse_args(["--malloc", "default"]).malloc) == {}
    assert local_ranks.MALLOC_TUNABLES == "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def test_emulated_hosts_run_fewer_steps_at_a_smaller_batch_unless_told(runtime, train, local_ranks):
    assert settings_of(runtime, local_ranks) == {"only": "", "steps": 16, "warmup": 2, "batch": 2048}
    assert settings_of(runtime, local_ranks, "--hosts", "2") == {"only": "", "steps": 3, "warmup": 1, "batch": 512}
    assert settings_of(runtime, local_ranks, "--hosts", "2", "--steps", "7", "--batch", "64") == {"only": "", "steps": 7, "warmup": 1, "batch": 64}
    assert settings_of(runtime, local_ranks, "--hosts", "2", "--quick") == runtime.QUICK
    assert settings_of(train, local_ranks) == {"only": "", "batch": 0, "warmup": 3, "iters": 20, "rounds": 5, "repeats": 3}
    assert settings_of(train, local_ranks, "--hosts", "2") == {"only": "", "batch": 0, "warmup": 2, "iters": 8, "rounds": 4, "repeats": 3}
    assert settings_of(train, local_ranks, "--hosts", "2", "--quick") == train.QUICK
    with pytest.raises(ValueError, match="--steps 3, --batch -1"):
        settings_of(runtime, local_ranks, "--hosts", "2", "--batch", "-1")


def runtime_result(case: str, embshard_s: float, torchrec_s: float, torchrec_pipelined_s: float) -> dict:
    return {"case": case, "embshard_s": embshard_s, "embshard_pipelined_s": embshard_s / 2, "torchrec_s": torchrec_s,
            "torchrec_pipelined_s": torchrec_pipelined_s,
            "range_s": {"embshard": [0.09, 0.12], "embshard_pipelined": [0.05, 0.06], "torchrec": [0.19, 0.25],
                        "torchrec_pipelined": [0.3, 0.45]},
            "phases_s": {"input_dist": 0.01, "lookup": 0.02, "output_dist": 0.03, "backward": 0.04}, "setup_s": 5.0, "case_s": 20.0}


def test_runtime_report_on_emulated_hosts_names_the_cluster_and_links_and_compares_with_the_faster_torchrec(runtime, local_ranks):
    results = [runtime_result("pooled table_wise", 0.1, 0.2, 0.4), runtime_result("sequence mixed", 0.2, 0.3, 0.1)]
    meta = {"hosts": local_ranks.Hosts(2, 2, 2.0, 0.1), "shaping": SHAPING, "steps": 3, "batch": 512,
            "profile": "none", "quick": False, "malloc": "kept", "command": "sudo cmd --hosts 2", "commit": "abc1234",
            "load": ("0.50 0.40 0.30", "3.90 2.10 1.00")}
    text = runtime.markdown(results, meta)
    assert text.startswith("## On 2 emulated hosts x 2 ranks, 2 Gbit/s inter-host links\n")
    assert "Commit: abc1234. Load average (1, 5, 15 min) before / after: 0.50 0.40 0.30 / 3.90 2.10 1.00 (its own 4 ranks" in text
    assert f"2 emulated hosts x 2 ranks on CPU, all 4 sharing this machine's cores (inter-host links: {SHAPING};" in text
    assert "batch 512 per rank" in text and "medians of 3 steps" in text
    rows = [line for line in text.splitlines() if line.startswith("| pooled") or line.startswith("| sequence")]
    # samples/s: 4 ranks x 512 / step s; speed-up against TorchRec's faster configuration; spread of that configuration
    assert rows[0] == ("| pooled table_wise | 20,480 | 40,960 | 10,240 | 5,120 | 2.00x | 4.00x | 10.0 | 20.0 | 30.0 | 40.0 "
                       "| 90-120 / 190-250 |")
    assert rows[1].startswith("| sequence mixed | 10,240 | 20,480 | 6,827 | 20,480 | 0.50x | 1.00x |") and rows[1].endswith(" 90-120 / 300-450 |")
    assert "geometric mean 1.00x, min 0.50x, max 2.00x over 2 cases" in text
    assert "Where the time goes" not in text  # the one-host section's paragraph
    one_host = runtime.markdown(results, {**meta, "hosts": local_ranks.Hosts(1, 2)})
    assert one_host.startswith(runtime.TITLE + "\n")
    assert f"2 ranks on CPU (1 thread each, glibc malloc keeping freed memory (GLIBC_TUNABLES={local_ranks.MALLOC_TUNABLES}" in one_host
    default = runtime.markdown(results, {**meta, "malloc": "default"})
    assert "(1 thread each, glibc malloc at its default settings), batch 512" in default


def test_train_report_on_emulated_hosts_has_the_links_and_the_rounds_spread(train, local_ranks):
    rates = {"embshard": [900.0, 1000.0], "embshard_pipelined": [1100.0], "torchrec": [700.0, 800.0], "torchrec_pipelined": [850.0, 500.0]}
    result = {"case": "DLRM dot, batch 512", "plan": {"table_wise": 26}, "load_average": 2.0, "repeat": 0,
              **{f"{c}_samples_per_s": max(x) for c, x in rates.items()}, **{f"{c}_samples_per_cpu_s": max(x) for c, x in rates.items()},
              **{f"{c}_rounds_samples_per_s": x for c, x in rates.items()}}
    meta = {"hosts": train.Hosts(2, 2, 1.0, 0.1), "shaping": SHAPING, "warmup": 2, "iters": 6, "rounds": 3, "profile": "none",
            "quick": True, "malloc": "default", "command": "sudo cmd", "commit": "abc1234 (uncommitted changes)", "load": ("0.50 0.40 0.30", "2.00 1.00 0.50"),
            "batch": 128}
    text = train.markdown([result], meta)
    own_batches = train.markdown([result], {**meta, "batch": 0, "quick": False})
    assert ("the median of 3 rounds of 6 steps at batch 2048 or more, 24 at batch 512 (the same samples per round) "
            "(after 2 warmup steps each)") in own_batches
    assert "Commit: abc1234 (uncommitted changes). Load average (1, 5, 15 min) before / after the run: 0.50 0.40 0.30 / 2.00 1.00 0.50." in text
    assert text.startswith("## On 2 emulated hosts x 2 ranks, 1 Gbit/s inter-host links (QUICK")
    assert "FBGEMM CPU 1.8.0, glibc malloc at its default settings." in text
    assert f"inter-host links: {SHAPING})" in text and "the median of 3 rounds of 6 steps (after 2 warmup steps each)" in text
    row = next(line for line in text.splitlines() if line.startswith("| DLRM"))
    assert row == ("| DLRM dot, batch 512 | table_wise 26 | 2.0 | 1,000 | 1,100 | 800 | 850 | 1.18x [1.18, 1.18] | 1.29x [1.29, 1.29] "
                   "| 1.18x [1.18, 1.18] | 1.29x [1.29, 1.29] | 900-1,000 / 500-850 |")


def test_the_hosts_section_and_the_one_host_file_leave_each_other_alone(load_benchmark, local_ranks, tmp_path):
    sections = load_benchmark("sections")
    out, two, one = tmp_path / "runtime.md", local_ranks.Hosts(2, 2), local_ranks.Hosts(1, 2)
    assert sections.write_results(None, "## hosts v1", out, two, True, "# T") is None and not out.exists()  # --quick: printed only
    assert sections.write_results(str(out), "## hosts v1", out, two, False, "# T") == out
    assert out.read_text() == "# T\n\n<!-- hosts:start -->\n## hosts v1\n<!-- hosts:end -->\n"
    sections.write_results(str(out), "# one host v1\n", out, one, False, "# T")
    assert out.read_text() == "# one host v1\n\n<!-- hosts:start -->\n## hosts v1\n<!-- hosts:end -->\n"
    sections.write_results(str(out), "## hosts v2", out, two, False, "# T")
    sections.write_results(str(out), "# one host v2\n", out, one, False, "# T")
    assert out.read_text() == "# one host v2\n\n<!-- hosts:start -->\n## hosts v2\n<!-- hosts:end -->\n"
    plain = tmp_path / "train.md"
    sections.write_results(str(plain), "# one host\n", plain, one, False, "# T")
    assert plain.read_text() == "# one host\n"


def test_across_hosts_the_runtime_cases_run_flat_where_the_cost_model_prices_the_in_host_reduction_above_it(runtime):
    """On 2 emulated hosts x 2 ranks (2 Gbit/s) pooled row_wise ran 290 ms a step with the in-host reduction and 242 ms
    flat (TorchRec 260 ms); the shipped profile prices it 92 / 79 ms. Its plan is now flat; where nothing is reduced in
    the host (table_wise), or on one host, the plan is as before."""
    cases = {name: (specs, layout) for name, specs, layout in runtime.cases(4, 2)}
    specs, layout = cases["pooled row_wise"]
    flat = runtime.case_plan(specs, layout, 4, 2, "cpu_gloo_measured", 512)
    in_host = runtime.manual_plan(specs, replace(flat.topology, reduce_in_host=True), layout)
    assert not flat.topology.reduce_in_host and flat.tables == in_host.tables
    assert flat.max_rank_ms < in_host.max_rank_ms
    assert runtime.case_plan(*cases["pooled table_wise"], 4, 2, "cpu_gloo_measured", 512).topology.reduce_in_host
    one_host = {name: (specs, layout) for name, specs, layout in runtime.cases(2, 2)}["pooled row_wise"]
    assert runtime.case_plan(*one_host, 2, 2, "cpu_gloo_measured", 2048).topology.reduce_in_host


def test_a_smaller_batch_runs_more_steps_per_round_with_the_same_samples(train):
    assert train.steps_per_round(8, 2048, 0) == 8
    assert train.steps_per_round(8, 512, 0) == 32  # DLRM batch 512: 4x the steps, the same samples as batch 2048's 8
    assert train.steps_per_round(8, 4096, 0) == 8  # a larger batch: as given
    assert train.steps_per_round(2, 512, 128) == 2  # --batch: every case runs the steps as given
    assert {b for _, _, b, *_ in train.CASES} == {512, 2048}  # what the results' sentence names
