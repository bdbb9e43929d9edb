"""The demo and a real-data pipeline give byte-identical shards and the same ``documents`` table as
recorded in tests/data/golden_outputs.json (see tests/support/golden_outputs.py): engine refactors must not
move a single token or signal. A deliberate change of outputs re-records the file in its commit."""

from __future__ import annotations

import json
import re
from pathlib import Path

from datapipe.audit.sql import connect as connect_stats
from datapipe.stages import STAGES
from tests.support.golden_outputs import GOLDEN, all_digests, versions
from tests.support.shared_data import shared_path


def test_demo_and_real_data_outputs_equal_the_recorded_ones(tmp_path: Path) -> None:
    shared = shared_path()
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    now = all_digests(shared, tmp_path)
    drift = {k: (v, versions()[k]) for k, v in golden["versions"].items() if versions()[k] != v}
    hint = (
        f" (library versions differ from the recording, {drift}: if only they changed, "
        f"re-record with `python -m tests.support.golden_outputs --write`)"
        if drift
        else ""
    )
    for run in ("demo", "real"):
        want, got = golden[run], now[run]
        assert got["documents"] == want["documents"], f"{run}: document count changed{hint}"
        moved = sorted(
            k for k in want["columns"].keys() | got["columns"].keys() if want["columns"].get(k) != got["columns"].get(k)
        )
        assert not moved, f"{run}: documents columns changed: {moved}{hint}"
        changed = sorted(k for k in want["shards"].keys() | got["shards"].keys() if want["shards"].get(k) != got["shards"].get(k))
        assert not changed, f"{run}: shard files differ: {changed[:10]}{hint}"
        assert len(got["shards"]) > 1, f"{run}: no shards written"
    # The reasons the stages dropped with are ones they declare (Stage.reasons, the stage index's table).
    for run in ("demo", "real"):
        with connect_stats(tmp_path / run) as con:
            dropped = con.execute(
                "select distinct stage, reason from documents where status = 'rejected' and stage <> 'read'"
            ).fetchall()
        assert dropped, run
        for stage, reason in dropped:
            declared = [re.sub(r"<[^>]+>", ".+", re.escape(r)) for r in STAGES[stage].reasons]  # <class>: any value
            assert any(re.fullmatch(d, reason) for d in declared), (
                f"{run}: {stage} dropped with {reason!r}, not among {STAGES[stage].reasons}"
            )
