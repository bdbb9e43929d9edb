"""MinHash verification and settling get the documents' columns by a join: only the *owner* of a map
output reads it (partition = shard modulo partitions), at most once a round, and answers the others:
the heads' signatures in round 1, its members for verification in round 2, survivors' and members'
ids and signatures when clusters settle. Counted on a small real run (zh/en Wikipedia with edited
copies, UDHR variants), engine task functions in this process: before the join every partition of
round 0 read every map output holding one of its paired documents (partitions x map outputs reads)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datapipe.engine import phases
from datapipe.engine.plan import build_stage
from datapipe.engine.tasks import reduce, reduce_inputs
from datapipe.engine.work_files import WorkFiles
from datapipe.run_folder.layout import RunFolder
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
    folder = RunFolder(Path(spec.root))
    map_tasks(spec, segment)

    reads: Counter[tuple[int, str]] = Counter()  # (round, map output) -> reads
    current: dict[str, Any] = {"round": -1, "parts": None}  # the partition task's range of parts
    ordinal = {WorkFiles(folder).map_output(segment.index, s.key).name: s.ordinal for s in spec.shards}
    foreign = []  # reads of a map output by a partition that does not own it
    original, whole = reduce_inputs._read_row_groups_of, reduce_inputs.ParquetReduceInputs.read_shard

    def count(path: str) -> None:
        name = Path(path).name
        reads[(current["round"], name)] += 1
        parts = current["parts"]
        if parts is not None and not parts[0] <= ordinal[name] % partitions < parts[1]:
            foreign.append((current["round"], parts, name))

    def counting(path: str, rows, columns, *opener):
        count(path)
        return original(path, rows, columns, *opener)

    def counting_whole(self, shard: int, columns):
        count(self.files[self.shards.index(shard)])
        return whole(self, shard, columns)

    monkeypatch.setattr(reduce_inputs, "_read_row_groups_of", counting)
    monkeypatch.setattr(reduce_inputs.ParquetReduceInputs, "read_shard", counting_whole)
    step = step_of(build_stage(spec, segment.compute_global), PartitionStep)
    assert step is not None

    def partition(spec, segment, round, task, outputs=None):  # each partition task, its round and parts noted
        current["round"], current["parts"] = round, (task.lo, task.hi)
        try:
            return reduce.reduce_partition(spec, segment, round, task, outputs)
        finally:
            current["parts"] = None

    monkeypatch.setattr(phases, "reduce_partition", partition)
    phases.run_here(spec, phases.segment_phases(spec, segment, map_phase_too=False))
    monkeypatch.undo()

    outputs = len(spec.shards)
    assert reads, "the run found near-duplicates to verify"
    assert max(reads.values()) == 1  # no map output read twice in a round
    assert not foreign  # only owners read
    by_round = Counter(r for r, _ in reads.elements())
    assert 0 not in by_round and by_round[1] >= 1  # the heads' signatures, from their owners
    assert by_round[2] == outputs  # every owner looks for its members under the heads' keys
    # A round reads each map output once at most, where before the join each of the 6 partitions
    # of round 0 read each map output holding one of its pairs.
    assert max(by_round.values()) <= outputs

    # And the outcome is the in-memory clustering's (the join changes who reads, not what is decided).
    from tests.dedup.test_minhash_rounds import _global_step

    got, sizes, _ = _global_step(spec, segment)  # the rounds again, from the map outputs
    expected, expected_sizes = _in_memory(spec, segment, "longest")
    assert got == expected and sizes == expected_sizes and len(expected) >= 20
