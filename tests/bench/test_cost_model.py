"""The crawl estimate (bench/scaling/cost_model.py) charges every term it claims: a task's CPU, requests at
the store's latency, bytes through the node's link, the store's throttling, the driver's adoption and its
serial planning, commit and end of the run; and it names what it charged a phase that was not measured."""

from __future__ import annotations

from bench.scaling import cost_model


def _task(phase: str, crawl: str, cpu: float, how: str) -> dict:
    return {"phase": phase, "crawl": crawl, "cpu_s": cpu, "peak_mib": 100.0, "how": how}


RESULTS = [
    _task("map0", "10 TB", 60.0, "measured (the same task at every size)"),
    _task("merge0", "10 TB", 5.0, "measured: 256 runs x 1,000 rows of 9 keys (100 tasks)"),
    _task("shuffle0", "10 TB", 3.0, "measured: 10 runs x 1,000 rows of 3 keys (200 tasks)"),
    _task("shuffle0", "100 TB", 4.0, "measured: 10 runs x 1,000 rows of 3 keys (2,000 tasks)"),
]
DRIVER = {
    "crawl": "10 TB",
    "tasks": 37_553 + 100 + 200 + 1,
    "phases": [
        {"phase": p, "tasks": n, "plan_cpu_s": 0.5, "submit_cpu_s": 0.0, "commit_cpu_s": 0.1, "adopt_cpu_us_per_task": 100.0}
        for p, n in (("map0", 37_253), ("merge0", 100), ("shuffle0", 200), ("reduce0", 1))
    ],
    "end_of_run": {"collect_counts_cpu_s": 30.0},
    "rss_kib_per_task": 1.0,
    "peak_mib": 500.0,
}


def test_every_term_adds_to_the_estimate_and_unmeasured_phases_are_named() -> None:
    drivers = {"10 TB": DRIVER}
    base = cost_model.estimate(RESULTS, drivers, "10 TB", 0.020, 25, throttled=False)
    phases = {p["phase"]: p for p in base["phases"]}
    assert "stand-in" in phases["reduce0"]["charged"] and phases["map0"]["charged"] == "measured"
    slower = cost_model.estimate(RESULTS, drivers, "10 TB", 0.100, 25, throttled=False)  # latency
    narrower = cost_model.estimate(RESULTS, drivers, "10 TB", 0.020, 10, throttled=False)  # link
    throttled = cost_model.estimate(RESULTS, drivers, "10 TB", 0.020, 25, throttled=True)
    assert slower["hours"] > base["hours"] and narrower["hours"] > base["hours"] and throttled["hours"] >= base["hours"]
    # planning + commit per phase, the end of the run, a phase of one task (nothing else runs meanwhile)
    serial = sum(p["serial_s"] for p in base["phases"]) + 30.0 + phases["reduce0"]["wall_s"]
    assert abs(base["serial_share"] * base["hours"] * 3600 - serial) < 1e-6
    # A phase measured only at the other size is charged that size's task, and said so; the driver's
    # figures of another size are scaled in tasks, and said so.
    far = cost_model.estimate(RESULTS, drivers, "100 TB", 0.020, 25, throttled=False)
    far_phases = {p["phase"]: p for p in far["phases"]}
    assert far_phases["map0"]["charged"].startswith("measured at 10 TB") and far_phases["shuffle0"]["charged"] == "measured"
    assert far["driver"].startswith("measured at 10 TB, scaled x10")


def test_the_driver_bounds_a_phase_whose_markers_it_cannot_adopt_as_fast_as_they_come() -> None:
    slow = {**DRIVER, "phases": [{**p, "adopt_cpu_us_per_task": 1e6} for p in DRIVER["phases"]]}  # a second each
    e = cost_model.estimate(RESULTS, {"10 TB": slow}, "10 TB", 0.020, 25, throttled=False)
    assert {p["phase"]: p["bound"] for p in e["phases"]}["map0"] == "driver adoption"
