"""MinHash verification and settling get the documents' columns by a join: a partition asks the owner
of each map output for the rows it needs, and the owner reads that map output once per answering
round. Counted on a small real run (zh/en Wikipedia with edited copies, UDHR variants), engine task
functions in this process: before the join every partition of round 0 read every map output holding
one of its paired documents (partitions x map outputs reads)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from datapipe.engine import phases
from datapipe.engine.plan import build_stage
from datapipe.engine.tasks import reduce, reduce_inputs
from datapipe.stages import PartitionStep
from datapipe.stages.global_stage import step_of
from tests.dedup.test_minhash_rounds import _in_memory, _pipeline, _wiki_docs, map_tasks


@pytest.mark.slow
def test_each_map_output_is_read_once_per_answering_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    docs = _wiki_docs(40)
    for f in range(4):
        (tmp_path / "data" / f"part-{f}.jsonl").write_text(
            "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs[f::4])
        )
    partitions = 6
    spec = _pipeline(tmp_path, partitions, "longest")
    segment = spec.segments[0]
    map_tasks(spec, segment)

    reads: Counter[tuple[int, str]] = Counter()  # (round, map output) -> reads
    current = {"round": -1}
    original = reduce_inputs._read_row_groups_of

    def counting(path: str, rows, columns, *opener):
        reads[(current["round"], Path(path).name)] += 1
        return original(path, rows, columns, *opener)

    monkeypatch.setattr(reduce_inputs, "_read_row_groups_of", counting)
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)
    assert step is not None

    def partition(spec, segment, round, task, outputs=None):  # each partition task, its round noted
        current["round"] = round
        return reduce.reduce_partition(spec, segment, round, task, outputs)

    monkeypatch.setattr(phases, "reduce_partition", partition)
    phases.run_here(spec, phases.segment_phases(spec, segment, map_phase_too=False))
    monkeypatch.undo()

    outputs = len(spec.shards)
    assert reads, "the run found near-duplicates to verify"
    assert max(reads.values()) == 1  # no map output read twice in a round
    by_round = Counter(r for r, _ in reads.elements())
    assert set(by_round) <= {r for r in range(1, step.rounds, 2)}  # only owners read, in answering rounds
    assert by_round[1] == outputs  # the signatures of round 2: every map output once
    # Before the join: each of the 6 partitions read each map output holding one of its pairs.
    assert sum(by_round.values()) <= outputs * len(by_round) < outputs * partitions

    # And the outcome is the in-memory clustering's (the join changes who reads, not what is decided).
    from tests.dedup.test_minhash_rounds import _global_step

    got, sizes, _ = _global_step(spec, segment)  # the rounds again, from the map outputs
    expected, expected_sizes = _in_memory(spec, segment, "longest")
    assert got == expected and sizes == expected_sizes and len(expected) >= 20
