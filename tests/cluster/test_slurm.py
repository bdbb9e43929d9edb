"""`datapipe cluster slurm --submit` end to end on a single-node Slurm started by the test.

slurmctld and slurmd (Debian's slurm-wlm, 22.05) run as real processes on 127.0.0.1 with a
throwaway slurm.conf (auth/none: no munge needed); the job starts Ray on its allocation and runs
the demo pipeline, whose outputs must equal an in-process run's. Skips, saying why, where the
Slurm daemons are not installed, not root, or do not come up.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.golden_outputs import output_digests, run_digests
from tests.support.shared_data import PROJECT_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.ray]

DEMO = PROJECT_ROOT / "pipelines" / "demo.yaml"
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol")


def _free_port() -> int:
    # above Ray's worker-port range (10002-19999), which Ray refuses to share with its head port
    for port in range(20000 + os.getpid() % 20000, 65000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


SLURM_CONF = """\
ClusterName=dptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture
def local_slurm() -> Iterator[dict[str, str]]:
    """A one-node Slurm on 127.0.0.1; yields the environment its clients need (SLURM_CONF)."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not on PATH; Debian: apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs (SlurmdUser=root); this test runs as a user")
    # short path: Ray's socket paths under the job's temp dir must stay under 107 bytes
    folder = Path(tempfile.mkdtemp(prefix="dpslurm-", dir="/tmp"))
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(ctld_port=_free_port(), d_port=_free_port() + 1, dir=folder, cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [
        subprocess.Popen(["slurmctld", "-D", "-c", "-i", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
        subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            if state.stdout.strip() == "idle":
                break
            dead = [d.args[0] for d in daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "".join(f"\n--- {p.name}:\n" + p.read_text(errors="replace")[-1500:] for p in folder.glob("*.log"))
                pytest.skip(f"the local Slurm did not come up ({', '.join(dead) or 'node not idle in 30 s'}): {logs}")
            time.sleep(0.5)
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], env=env, capture_output=True)
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_slurm_job_starts_ray_and_runs_the_pipeline(local_slurm: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Token authentication, as a lab's cluster has it: a token file, RAY_AUTH_MODE unset. `ray start`
    # turns the mode on from the file but Ray 2.60's `ray health-check` does not: the script settles it.
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(32))
    env = {
        **{k: v for k, v in local_slurm.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")},
        "PYTHONPATH": str(PROJECT_ROOT),  # the job's `datapipe` is this checkout's
        "DATAPIPE_RAY_HEAD_IP": "127.0.0.1",  # one node: Ray on loopback
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_TOKEN_PATH": str(token),
    }
    cmd = ["datapipe", "cluster", "slurm", str(DEMO), "--output", str(out), "--cpus", str(os.cpu_count() or 1)]
    cmd += ["--port", str(_free_port()), "--log", str(tmp_path / "job-%j.log"), "--submit"]
    submitted = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    assert job.isdigit(), submitted.stdout
    deadline = time.monotonic() + 400
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} still running after 400 s"
        time.sleep(1)
    log = (tmp_path / f"job-{job}.log").read_text(errors="replace")
    info = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in info and "ExitCode=0:0" in info, f"{info}\n{log[-4000:]}"
    assert "ray: 1 of 1 node(s) up at 127.0.0.1:" in log
    # Ray stopped with the job: no process of its per-job temp dir is left
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"/tmp/ray-{job}" not in ps
    shutil.rmtree(f"/tmp/ray-{job}", ignore_errors=True)  # the job's Ray logs
    for name in ("docs", "rejected", "shards", "stats.duckdb", "run.json"):
        assert (out / name).exists(), name
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert output_digests(out) == run_digests(DEMO, tmp_path / "in_process")


def test_printed_script_is_valid_bash_with_the_sbatch_options(tmp_path: Path) -> None:
    """Where no Slurm runs (CI): the script parses (`bash -n`) and carries the options given."""
    from click.testing import CliRunner

    from datapipe.cli import main

    args = ["cluster", "slurm", str(DEMO), "--nodes", "3", "--cpus", "16", "--mem", "64G", "--time", "2:00:00"]
    args += ["--partition", "cpu", "--output", "runs/demo", "--setup", "source /opt/venv/bin/activate"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    script = result.stdout  # the script alone: warnings go to stderr
    (tmp_path / "job.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], capture_output=True).returncode == 0
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for option in ("--nodes=3", "--cpus-per-task=16", "--mem=64G", "--time=2:00:00", "--partition=cpu", "--exclusive"):
        assert any(line.split()[1] == option for line in sbatch), option
    assert "source /opt/venv/bin/activate" in script and "trap stop_ray EXIT" in script
    # On 3 nodes the head gives Ray one core less (the driver's): run the script's own lines for it.
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("head_cpus="))
    logic = "\n".join(lines[start : start + 2])
    for nodes, cpus, want in (("a b c", 16, "15"), ("a", 16, "16"), ("a b", 1, "1")):
        got = subprocess.run(
            ["bash", "-c", f"nodes=({nodes}); cpus={cpus}\n{logic}\necho $head_cpus"], capture_output=True, text=True
        )
        assert got.stdout.strip() == want, (nodes, cpus, got.stderr)
    assert next(line for line in lines if line.startswith("ray start --head")).count('--num-cpus="$head_cpus"') == 1
    run_line = next(line for line in script.splitlines() if line.startswith("datapipe run "))
    assert run_line == (
        f'datapipe run {DEMO} --ray-address "$head_ip:$port" --no-progress --output {Path("runs/demo").absolute()}'
    )
    bad = CliRunner().invoke(main, ["cluster", "slurm", str(DEMO), "--mem", "64 G"])
    assert bad.exit_code == 2 and "#SBATCH" in bad.output
