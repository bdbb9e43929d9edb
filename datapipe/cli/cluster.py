"""``datapipe cluster kuberay`` and ``cluster slurm``, beside what they print: a KubeRay ``RayJob``
manifest and a Slurm batch script.

Both start a Ray cluster whose driver is ``datapipe run PIPELINE --ray-address ...``; neither
needs anything of datapipe at render time beyond the pipeline file's text. The manifest is built
as plain dicts and dumped with ``yaml.safe_dump`` (valid YAML whatever the values hold); the batch
script is bash, its values quoted with ``shlex.quote``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import yaml

from datapipe.cli.options import fail
from datapipe.errors import UsageError

DEFAULT_IMAGE = "rayproject/ray:2.60.0-py311"
RAY_VERSION = "2.60.0"
PIPELINE_MOUNT = "/etc/datapipe"  # where the ConfigMap's pipeline file appears in every pod
PIPELINE_KEY = "pipeline.yaml"
# Object-storage credentials the pods read from a Secret (never written into the manifest).
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def k8s_name(text: str) -> str:
    """``text`` as a Kubernetes object name (RFC 1123 label: lower case, digits, '-', at most 63)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    if not name:
        raise UsageError(f"--name {text!r} has no letter or digit: give a name of a-z, 0-9 and '-'")
    return name


def _pod_template(
    container: str, image: str, cpu: str, memory: str, env: list[dict[str, Any]], configmap: str | None
) -> dict[str, Any]:
    mount = configmap is not None
    resources = {"cpu": cpu, "memory": memory}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": container,
                "image": image,
                # requests == limits: Ray sizes its CPUs and memory from what the pod is given
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                **({"env": env} if env else {}),
                **({"volumeMounts": [{"name": "pipeline", "mountPath": PIPELINE_MOUNT, "readOnly": True}]} if mount else {}),
            }
        ]
    }
    if mount:
        spec["volumes"] = [{"name": "pipeline", "configMap": {"name": configmap}}]
    return {"spec": spec}


def kuberay_manifest(
    pipeline_text: str | None,
    *,
    name: str,
    pipeline_path: str | None = None,
    output: str | None = None,
    image: str = DEFAULT_IMAGE,
    workers: int = 1,
    min_workers: int | None = None,
    max_workers: int | None = None,
    head_cpu: str = "2",
    head_memory: str = "8Gi",
    worker_cpu: str = "4",
    worker_memory: str = "16Gi",
    secret: str | None = None,
    endpoint_url: str | None = None,
) -> list[dict[str, Any]]:
    """The documents of a RayJob manifest: a ConfigMap with the pipeline file (unless
    ``pipeline_path`` names one inside the image) and the ``RayJob``."""
    if (pipeline_text is None) == (pipeline_path is None):
        raise UsageError("give the pipeline's text (a ConfigMap) or --pipeline-in-image PATH, not both")
    low = workers if min_workers is None else min_workers
    high = workers if max_workers is None else max_workers
    if not low <= workers <= high:
        raise UsageError(f"--min-workers {low} <= --workers {workers} <= --max-workers {high} does not hold")
    name = k8s_name(name)
    configmap = f"{name}-pipeline"
    mount = pipeline_text is not None
    pipeline_file = f"{PIPELINE_MOUNT}/{PIPELINE_KEY}" if mount else str(pipeline_path)
    entrypoint = ["datapipe", "run", pipeline_file, "--ray-address", "auto", "--no-progress"]
    if output:
        entrypoint += ["--output", output]
    env: list[dict[str, Any]] = []
    if secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for key in SECRET_KEYS]
    if endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": endpoint_url})
    head = _pod_template("ray-head", image, head_cpu, head_memory, env, configmap if mount else None)
    head["spec"]["containers"][0]["ports"] = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
    ]
    worker = _pod_template("ray-worker", image, worker_cpu, worker_memory, env, configmap if mount else None)
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "datapipe"}},
        "spec": {
            "entrypoint": shlex.join(entrypoint),
            # the cluster lives for this one run; the finished RayJob object stays 10 minutes
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                # the job is submitted through the head's dashboard: it must listen beyond the pod.
                # num-cpus 0: no task runs on the head, which holds the GCS and the driver (the job's
                # entrypoint, the run's one serial process, slowed when it competes with tasks;
                # docs/scaling.md), as Ray's guide advises for large clusters.
                "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"}, "template": head},
                "workerGroupSpecs": [
                    {
                        "groupName": "workers",
                        "replicas": workers,
                        "minReplicas": low,
                        "maxReplicas": high,
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
        },
    }
    docs: list[dict[str, Any]] = []
    if mount:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": configmap, "labels": {"app.kubernetes.io/name": "datapipe"}},
                "data": {PIPELINE_KEY: pipeline_text},
            }
        )
    return docs + [rayjob]


class _BlockStr(str):
    """A string dumped as a YAML block (``|``): the pipeline file stays readable in the manifest."""


def _block(dumper: yaml.SafeDumper, data: _BlockStr) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # the pods' shared env list written out twice, not as &id001 / *id001


_Dumper.add_representer(_BlockStr, _block)


def dump_manifest(docs: list[dict[str, Any]]) -> str:
    """``docs`` as one multi-document YAML stream, the pipeline text as a literal block."""
    for doc in docs:
        if doc.get("kind") == "ConfigMap":
            text = doc["data"][PIPELINE_KEY]
            # a block scalar cannot keep trailing spaces or tabs exactly; those texts stay quoted
            if "\t" not in text and not re.search(r" \n| $", text):
                doc["data"][PIPELINE_KEY] = _BlockStr(text if text.endswith("\n") else text + "\n")
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False)


SLURM_TEMPLATE = """\
#!/bin/bash
{sbatch}
# Ray on this Slurm allocation, then one datapipe run on it (printed by `datapipe cluster slurm`).
# Every node needs datapipe and Ray installed; the pipeline's inputs and the run folder must be
# on storage every node reads and writes (a shared file system, or s3:// gs:// hdfs://).
set -euo pipefail
{setup}
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_node=${{nodes[0]}}    # this script runs on the allocation's first node: the head and the driver
# DATAPIPE_RAY_HEAD_IP picks the head's address where a node has several (e.g. 127.0.0.1 on one node)
head_ip=${{DATAPIPE_RAY_HEAD_IP:-$(hostname --ip-address | awk '{{print $1}}')}}
case $head_ip in 127.*) export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ;; esac  # else Ray swaps loopback for the host's address
# Ray's token authentication: `ray start` turns it on when it finds a token (RAY_AUTH_TOKEN, the file
# at RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), but `ray health-check` (Ray 2.60) reads the mode from
# RAY_AUTH_MODE only and is refused without it: one mode for every Ray command of the job.
if [[ -z ${{RAY_AUTH_MODE:-}} && ( -n ${{RAY_AUTH_TOKEN:-}} || -f ${{RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}} ) ]]; then
  export RAY_AUTH_MODE=token
fi
port={port}
cpus=${{SLURM_CPUS_PER_TASK:-${{SLURM_CPUS_ON_NODE:-1}}}}
ray_tmp={ray_tmp}    # per job: Ray's default /tmp/ray is shared by every job on a node

pids=()
stop_ray() {{
  # `ray start --block` stops its node's processes when signalled; `ray stop` would also stop
  # other jobs' Ray on a shared node, so it is not used.
  for pid in "${{pids[@]}}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}}
trap stop_ray EXIT

# On several nodes the head keeps one core out of Ray's: the driver (`datapipe run`, below) is the
# run's one serial process, dispatching and collecting every task beside the GCS, and slowed on
# loaded cores (docs/scaling.md). One node: every core.
head_cpus=$cpus
if (( ${{#nodes[@]}} > 1 && cpus > 1 )); then head_cpus=$(( cpus - 1 )); fi
ray start --head --block --node-ip-address="$head_ip" --port="$port" --num-cpus="$head_cpus" \\
  --temp-dir="$ray_tmp" --include-dashboard=false --disable-usage-stats &
pids+=($!)
if (( ${{#nodes[@]}} > 1 )); then
  # one `ray start` per other node, in one job step that shares the allocation's CPUs
  srun --overlap --nodes=$(( ${{#nodes[@]}} - 1 )) --ntasks-per-node=1 --exclude="$head_node" \\
    ray start --block --address="$head_ip:$port" --num-cpus="$cpus" --temp-dir="$ray_tmp" --disable-usage-stats &
  pids+=($!)
fi

# wait until the head answers, then until every node of the allocation has joined
deadline=$(( SECONDS + {wait_s} ))
until ray health-check --address="$head_ip:$port" >/dev/null 2>&1; do
  kill -0 "${{pids[0]}}" 2>/dev/null || {{ echo "ray start --head failed (its output is above)" >&2; exit 1; }}
  (( SECONDS < deadline )) || {{ echo "no Ray head at $head_ip:$port after {wait_s} s" >&2; exit 1; }}
  sleep 1
done
timeout $(( deadline - SECONDS + 1 )) python - "$head_ip:$port" "${{#nodes[@]}}" <<'EOF'
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
want = int(sys.argv[2])
while (alive := sum(node["Alive"] for node in ray.nodes())) < want:
    time.sleep(1)
print(f"ray: {{alive}} of {{want}} node(s) up at {{sys.argv[1]}}", flush=True)
EOF

{run}
"""


def slurm_script(
    pipeline: str,
    *,
    name: str,
    nodes: int = 1,
    cpus_per_node: int = 4,
    mem: str | None = None,
    time: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    output: str | None = None,
    log: str | None = None,
    setup: list[str] | tuple[str, ...] = (),
    port: int = 6379,
    ray_temp_dir: str | None = None,
    wait_s: int = 300,
) -> str:
    """An sbatch script: Ray's head on the first node, a worker on each other one, then the run."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise UsageError(f"--name {name!r}: a Slurm job name here is letters, digits, '.', '_' and '-'")
    lines = [
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus_per_node}",
        "#SBATCH --exclusive" if nodes > 1 else None,
        f"#SBATCH --mem={mem}" if mem else None,
        f"#SBATCH --time={time}" if time else None,
        f"#SBATCH --partition={partition}" if partition else None,
        f"#SBATCH --account={account}" if account else None,
        f"#SBATCH --output={log}" if log else None,
    ]
    for value in (mem, time, partition, account, log):
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise UsageError(f"an #SBATCH value may not be empty or hold spaces: {value!r}")
    run = ["datapipe", "run", pipeline, "--ray-address", "$head_ip:$port", "--no-progress"]
    if output:
        run += ["--output", output]
    run_line = " ".join(part if part.startswith("$") else shlex.quote(part) for part in run)
    run_line = run_line.replace("$head_ip:$port", '"$head_ip:$port"')
    tmp = shlex.quote(ray_temp_dir) if ray_temp_dir else '"/tmp/ray-$SLURM_JOB_ID"'
    setup_text = "\n".join(["# environment set-up (--setup):", *setup]) if setup else ""
    return SLURM_TEMPLATE.format(
        sbatch="\n".join(line for line in lines if line),
        setup=setup_text,
        port=port,
        ray_tmp=tmp,
        wait_s=wait_s,
        run=run_line,
    )


def read_pipeline(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the pipeline file {path}: {exc.strerror or exc}") from exc


# Ray's published images hold Ray and Python, not datapipe: a job on one fails at `datapipe run`.
STOCK_IMAGES = ("rayproject/ray", "docker.io/rayproject/ray", "rayproject/ray-ml", "docker.io/rayproject/ray-ml")
# Stage options that name a file or folder (relative to the pipeline file); plugins' keys are not known.
_PATH_KEYS = {"path", "paths", "model", "tokenizer", "prompt_file", "output_schema_file"}
_NOT_PATH = {("annotate", "model")}  # the model name a server knows, not a file


def _path_settings(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(YAML key path, value) of every setting of a pipeline file that names a local file or folder:
    ``output``, ``sources[i].paths``, ``tokenize.tokenizer``, and stage options that name files
    (models, prompts, benchmarks, quality rule files)."""
    out: list[tuple[str, str]] = []
    if isinstance(raw.get("output"), str):
        out.append(("output", raw["output"]))
    for i, src in enumerate(raw.get("sources") or []):
        paths = src.get("paths") if isinstance(src, dict) else None
        for j, p in enumerate(paths if isinstance(paths, list) else []):
            if isinstance(p, str):
                out.append((f"sources[{i}].paths[{j}]", p))
    tokenize = raw.get("tokenize")
    if isinstance(tokenize, dict) and isinstance(tokenize.get("tokenizer"), str):
        out.append(("tokenize.tokenizer", tokenize["tokenizer"]))

    def walk(kind: str, value: Any, where: str, key: str | None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(kind, v, f"{where}.{k}", str(k))
        elif isinstance(value, list):
            for n, v in enumerate(value):
                walk(kind, v, f"{where}[{n}]", key)
        elif isinstance(value, str) and key in _PATH_KEYS and (kind, key) not in _NOT_PATH:
            out.append((where, value))

    for i, stage in enumerate(raw.get("stages") or []):
        if not (isinstance(stage, dict) and len(stage) == 1):
            continue
        ((kind, options),) = stage.items()
        if kind == "quality" and isinstance(options, dict) and isinstance(options.get("rules"), dict):
            for k, v in options["rules"].items():  # a rule-set file, or a preset's name
                if isinstance(v, str) and ("/" in v or v.endswith((".yaml", ".yml"))):
                    out.append((f"stages[{i}].quality.rules.{k}", v))
        walk(str(kind), options, f"stages[{i}].{kind}", None)
    return out


def _is_local_relative(value: str) -> bool:
    from datapipe.storage.uri import is_uri

    return not is_uri(value) and not Path(value).expanduser().is_absolute() and not value.startswith("~")


def _loopback_endpoints(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(key path, URL) of annotate endpoints on this machine's loopback (``localhost``, 127.x, ::1)."""
    from urllib.parse import urlsplit

    out = []
    for i, stage in enumerate(raw.get("stages") or []):
        options = stage.get("annotate") if isinstance(stage, dict) else None
        endpoint = options.get("endpoint") if isinstance(options, dict) else None
        if not isinstance(endpoint, str):
            continue
        try:
            host = urlsplit(endpoint).hostname or ""
        except ValueError:
            continue
        if host == "localhost" or host.startswith("127.") or host in ("::1", "0.0.0.0"):
            out.append((f"stages[{i}].annotate.endpoint", endpoint))
    return out


def render_warnings(
    pipeline_text: str | None,
    pipeline_dir: Path,
    target: str,
    *,
    output: str | None = None,
    image: str | None = None,
) -> list[str]:
    """One line per setting that makes the rendered job fail or lose its work, as far as the pipeline
    file and the options tell: relative local paths, no run folder in object storage (KubeRay), Ray's
    stock image (it has no datapipe), an annotate endpoint on this machine's loopback.

    ``target``: ``kuberay`` (the pipeline file shipped in a ConfigMap; ``pipeline_text`` None when it
    is inside the image, whose relative paths are the image's business), ``slurm``."""
    from datapipe.storage.uri import is_uri

    warnings: list[str] = []
    try:
        raw = yaml.safe_load(pipeline_text) if pipeline_text is not None else None
    except yaml.YAMLError:
        raw = None  # `datapipe validate` says what is wrong with it; the job would fail the same way
    raw = raw if isinstance(raw, dict) else {}
    for where, value in _path_settings(raw):
        if where == "output" and (output or target == "kuberay"):
            continue  # --output replaces it; on KubeRay, "no output URI" below says it
        if not _is_local_relative(value):
            continue
        if target == "kuberay":
            warnings.append(
                f"{where}: {value!r} is a relative local path; in the pods it resolves against {PIPELINE_MOUNT}, "
                "where only the pipeline file is: use an s3:// or gs:// URI, or an absolute path inside the image"
            )
        else:
            warnings.append(
                f"{where}: {value!r} is a relative local path; the nodes read it as {pipeline_dir / value}: every "
                "node must see that path (a shared file system), else use an s3:// or gs:// URI"
            )
    if target == "kuberay":
        if output is None and pipeline_text is None:
            warnings.append(
                "no --output: the run folder is the output: of the pipeline file in the image; unless that is an "
                "s3:// or gs:// URI, it is written inside the head pod and lost when the cluster is deleted"
            )
        elif output is None and not (isinstance(raw.get("output"), str) and is_uri(raw["output"])):
            warnings.append(
                "no output URI (--output, or the pipeline's output:): the run folder would be written inside the "
                "head pod and lost when the cluster is deleted at the end of the job; give --output s3://BUCKET/PATH"
            )
        elif output is not None and not is_uri(output):
            warnings.append(
                f"--output {output!r} is a local path in the head pod: the run folder is lost when the cluster is "
                "deleted at the end of the job; give an s3:// or gs:// URI"
            )
        if image is not None and image.rsplit(":", 1)[0].split("@")[0] in STOCK_IMAGES:
            warnings.append(
                f"--image {image}: Ray's stock image has no datapipe, so the job fails at `datapipe run`; build one "
                "FROM it with `pip install datapipe` (and `datapipe models fetch`) and pass it with --image"
            )
    if target == "slurm" and output is None and "output" not in raw:
        name = str(raw["name"]) if isinstance(raw.get("name"), str) else "NAME"
        warnings.append(
            f"no output (--output, or the pipeline's output:): the run folder is {pipeline_dir / 'out' / name}, "
            "which every node writes: it must be on a shared file system, else give --output s3://BUCKET/PATH"
        )
    for where, endpoint in _loopback_endpoints(raw):
        place = "each pod" if target == "kuberay" else "each node"
        warnings.append(
            f"{where}: {endpoint} is a loopback address: in {place} it names that {place.split()[1]} itself, not "
            "this machine's server; give an address the cluster can reach (or set endpoint_env there)"
        )
    return warnings


@click.group()
def cluster() -> None:
    """Print (or submit) what runs a pipeline on a Ray cluster: a KubeRay RayJob or a Slurm job.

    \b
      datapipe cluster kuberay p.yaml --output s3://bucket/runs/p | kubectl apply -f -
      datapipe cluster slurm p.yaml --nodes 4 --time 4:00:00 > p.sbatch   # or --submit
    """


@cluster.command("kuberay")
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="RayJob name (default: the pipeline file's name).")
@click.option("--output", "-o", help="Run folder, passed to `datapipe run --output`: an s3:// gs:// hdfs:// URI.")
@click.option(
    "--image",
    default="rayproject/ray:2.60.0-py311",
    show_default=True,
    help="Image of every Ray pod. It must hold datapipe (and its Ray version): build one FROM this "
    "with `pip install datapipe` and `datapipe models fetch`.",
)
@click.option(
    "--pipeline-in-image",
    metavar="PATH",
    help="Use the pipeline file at PATH inside the image instead of shipping PIPELINE in a ConfigMap.",
)
@click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True, help="Worker pods.")
@click.option("--min-workers", type=click.IntRange(min=0), help="Autoscaling floor (default: --workers).")
@click.option("--max-workers", type=click.IntRange(min=0), help="Autoscaling ceiling (default: --workers).")
@click.option("--head-cpu", default="2", show_default=True, help="Head pod CPU request and limit.")
@click.option("--head-memory", default="8Gi", show_default=True, help="Head pod memory request and limit.")
@click.option("--worker-cpu", default="4", show_default=True, help="Worker pod CPU request and limit.")
@click.option("--worker-memory", default="16Gi", show_default=True, help="Worker pod memory request and limit.")
@click.option(
    "--secret",
    metavar="NAME",
    help="Kubernetes Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, referenced (never "
    "copied) into every pod's environment.",
)
@click.option("--endpoint-url", metavar="URL", help="AWS_ENDPOINT_URL for an S3-compatible store (MinIO, Ceph).")
def cluster_kuberay(
    pipeline: Path,
    name: str | None,
    output: str | None,
    image: str,
    pipeline_in_image: str | None,
    workers: int,
    min_workers: int | None,
    max_workers: int | None,
    head_cpu: str,
    head_memory: str,
    worker_cpu: str,
    worker_memory: str,
    secret: str | None,
    endpoint_url: str | None,
) -> None:
    """Print a KubeRay RayJob (ray.io/v1) that runs PIPELINE on a Ray cluster of its own.

    The pipeline file goes in a ConfigMap printed before the RayJob (mounted at
    /etc/datapipe/pipeline.yaml), unless --pipeline-in-image names it inside the image. Its
    inputs and the run folder must be reachable from every pod: object storage, or paths in the
    image. Apply with `kubectl apply -f -`; the cluster is deleted when the run ends.
    """
    text = None if pipeline_in_image else read_pipeline(pipeline)
    for warning in render_warnings(text, pipeline.parent.absolute(), "kuberay", output=output, image=image):
        click.echo(f"warning: {warning}", err=True)
    docs = kuberay_manifest(
        text,
        name=name or pipeline.stem,
        pipeline_path=pipeline_in_image,
        output=output,
        image=image,
        workers=workers,
        min_workers=min_workers,
        max_workers=max_workers,
        head_cpu=head_cpu,
        head_memory=head_memory,
        worker_cpu=worker_cpu,
        worker_memory=worker_memory,
        secret=secret,
        endpoint_url=endpoint_url,
    )
    click.echo(dump_manifest(docs), nl=False)


@cluster.command("slurm")
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output", "-o", help="Run folder, passed to `datapipe run --output` (shared storage or a URI).")
@click.option("--name", help="Job name (default: datapipe-<pipeline file name>).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="#SBATCH --nodes.")
@click.option(
    "--cpus", type=click.IntRange(min=1), default=4, show_default=True, help="#SBATCH --cpus-per-task: Ray's CPUs per node."
)
@click.option("--mem", help="#SBATCH --mem per node (e.g. 32G).")
@click.option("--time", "time_limit", help="#SBATCH --time (e.g. 4:00:00).")
@click.option("--partition", help="#SBATCH --partition.")
@click.option("--account", help="#SBATCH --account.")
@click.option("--log", help="#SBATCH --output: the job's log file (Slurm's default: slurm-<jobid>.out).")
@click.option(
    "--setup",
    multiple=True,
    metavar="LINE",
    help="A shell line run first on the head node, e.g. 'source ~/venv/bin/activate' (repeatable). "
    "Other nodes get the environment sbatch exported.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=6379, show_default=True, help="Ray head port.")
@click.option("--submit", is_flag=True, help="Pipe the script to sbatch and print the job id instead.")
def cluster_slurm(
    pipeline: Path,
    output: str | None,
    name: str | None,
    nodes: int,
    cpus: int,
    mem: str | None,
    time_limit: str | None,
    partition: str | None,
    account: str | None,
    log: str | None,
    setup: tuple[str, ...],
    port: int,
    submit: bool,
) -> None:
    """Print an sbatch script that starts Ray on its allocation and runs PIPELINE on it.

    Ray's head starts on the allocation's first node (where the script and the driver run), a
    worker on each other node (srun); once every node has joined, `datapipe run PIPELINE
    --ray-address HEAD:PORT` runs, and Ray stops when the script exits, however it exits.
    """
    import subprocess

    from datapipe.storage.uri import is_uri

    for warning in render_warnings(read_pipeline(pipeline), pipeline.parent.absolute(), "slurm", output=output):
        click.echo(f"warning: {warning}", err=True)
    if output and not is_uri(output):
        output = str(Path(output).absolute())
    script = slurm_script(
        str(pipeline.absolute()),
        name=name or f"datapipe-{pipeline.stem}",
        nodes=nodes,
        cpus_per_node=cpus,
        mem=mem,
        time=time_limit,
        partition=partition,
        account=account,
        output=output,
        log=log,
        setup=setup,
        port=port,
    )
    if not submit:
        click.echo(script, nl=False)
        return
    try:
        done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True)
    except FileNotFoundError:
        fail("sbatch is not on PATH: run this on a Slurm login node, or drop --submit to print the script")
    if done.returncode != 0:
        fail(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}", code=1)
    click.echo(done.stdout.strip().split(";")[0])
