"""Benchmarking on a Ray cluster (issue 22): kernel_harness/farm and benchmark_cpu.py --cluster.

One local Ray head (one bench slot) serves the whole module: it is started
once, bounded in time, and stopped at the end even when a test fails.  It
listens on the address Ray picks for this machine, as a head for several
machines does, so that a second node can join it with ``farm node --address``
(the last tests: a joining node on the same machine, the one honest
multi-node cluster one host can run; a joiner cannot use a 127.0.0.1 head,
because ``ray start --address 127.0.0.1:P`` rewrites the address to the
machine's).
The node hides AMX (``KERNEL_HARNESS_CPU_FLAGS``) so that "a class the cluster
lacks" is the same on every CPU.  The remote runs use the session's catalogue
kernel (tests/fixtures_kernels.py): no extra build.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import PROJECT_ROOT, run_script
from kernel_harness import cpu
from kernel_harness.errors import UsageError
from kernel_harness.farm import require_ray
from kernel_harness.farm.classes import NodeInfo
from kernel_harness.farm.merge import class_json_path, merged_report, overall_exit
from kernel_harness.farm.submit import choose_targets, forwarded_args

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install -e '.[cluster]')")
BASELINE = PROJECT_ROOT / "examples" / "rms_norm" / "baseline.py"
OP = "harness_catalogue.rms_norm"
#: few, short rounds: these tests check behaviour, not precision
FAST = ["--accept-if-as-accurate", "--rounds", "2", "--calls", "2"]
VARIANT = "torch213-cxx11-cpu-x86_64-linux"


# --------------------------------------------------------------------------- without a cluster

def test_without_ray_cluster_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UsageError) as info:
        require_ray()
    assert "pip install -e '.[cluster]'" in info.value.message and info.value.exit_code == 2


def _node(node_id: str, classes: tuple[str, ...], variant: str | None = VARIANT, slots: int = 1) -> NodeInfo:
    top = classes[-1] if classes else "generic"
    return NodeInfo(node_id=node_id, address="10.0.0.1", hostname=node_id, classes=classes, top=top,
                    model="cpu", variant=variant, slots=slots, free_slots=slots)


def test_targets_pick_class_variant_and_one_job_per_class():
    zen, icx = _node("zen", ("avx2",)), _node("spr", ("avx2", "avx512", "amx"))
    [one] = choose_targets([zen, icx], [VARIANT], "avx512", all_classes=False)
    assert one.resources["bench_slot"] == 1 and "isa_avx512" in one.resources
    assert one.resources[f"torch_variant:{VARIANT}"] > 0
    per_class = choose_targets([zen, icx, _node("zen2", ("avx2",))], [VARIANT], "any", all_classes=True)
    assert [t.label for t in per_class] == ["avx2", "amx"]
    assert all(f"cpu_class:{t.label}" in t.resources for t in per_class)
    with pytest.raises(UsageError) as info:
        choose_targets([zen], [VARIANT], "amx", all_classes=False)
    assert "amx" in info.value.message and "avx2" in info.value.message
    with pytest.raises(UsageError) as info:
        choose_targets([zen], ["torch299-cxx98-cpu-x86_64-linux"], "any", all_classes=False)
    assert "torch299-cxx98-cpu-x86_64-linux" in info.value.message and VARIANT in info.value.message
    with pytest.raises(UsageError, match="no farm node"):
        choose_targets([_node("plain", ("avx2",), slots=0)], [VARIANT], "any", all_classes=False)


def test_a_queued_job_whose_nodes_are_all_gone_is_lost_not_pending_for_ever():
    from kernel_harness.farm.submit import JobLost, Target, _wait_for_start

    class FakeRay:
        """Ray with the job queued and the cluster's only node dead."""
        polls = 0

        def wait(self, refs, timeout=None):
            self.polls += 1
            return [], refs

        def nodes(self):
            return [{"Alive": False, "Resources": {"bench_slot": 1, "isa_avx2": 1}}]

    fake = FakeRay()
    with pytest.raises(JobLost, match="no alive node"):
        _wait_for_start(fake, object(), Target("avx2", {"bench_slot": 1, "isa_avx2": 0.01}, VARIANT))
    assert fake.polls == 2


def test_forwarded_flags_and_result_files():
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("benchmark_cpu_farm", PROJECT_ROOT / "scripts" / "benchmark_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = module.build_parser()
    args = parser.parse_args(["b.py", "--kernel-package", "k", "--op", "k.f", "--rounds", "3", "--cold",
                              "--cluster", "auto", "--cpu-class", "avx2", "--json", "x.json"])
    forwarded = forwarded_args(args, parser)
    assert "--cluster" not in forwarded and "--json" not in forwarded
    assert ["--op", "k.f"] == forwarded[forwarded.index("--op"):forwarded.index("--op") + 2]
    assert "--cold" in forwarded and forwarded[forwarded.index("--rounds") + 1] == "3"
    assert "--cpu-class" not in forwarded and "b.py" not in forwarded
    assert class_json_path(Path("out/run.json"), "avx512") == Path("out/run.avx512.json")
    assert overall_exit([0, 1, 3, 2]) == 3 and overall_exit([0, 0]) == 0
    merged = merged_report({"baseline_file": "/tmp/n/b.py", "speedup": 2.0}, {"node": "n"},
                           {"baseline_file": "/home/b.py", "kernel_package": "/home/k"})
    assert merged["baseline_file"] == "/home/b.py" and "kernel_package" not in merged
    assert merged["remote"]["node_paths"] == {"baseline_file": "/tmp/n/b.py"} and merged["speedup"] == 2.0
    vs = merged_report({"vs_against": {"against": "/tmp/n/against/k", "ratio": 1.0}}, {}, {"against": "../k"})
    assert vs["vs_against"] == {"against": "../k", "ratio": 1.0}
    assert vs["remote"]["node_paths"] == {"against": "/tmp/n/against/k"}


def test_the_benchmark_on_a_node_drops_only_rays_thread_cap():
    from kernel_harness.farm.remote import NODE_OMP_ENV, benchmark_env

    def omp(environ, driver=None):
        env, threads = benchmark_env(environ, driver_omp=driver)
        assert env["PATH"] == "/bin"
        return env.get("OMP_NUM_THREADS"), threads.source

    # a farm node started without OMP_NUM_THREADS: the 1 in the worker is Ray's task cap
    assert omp({"OMP_NUM_THREADS": "1", NODE_OMP_ENV: "", "PATH": "/bin"}) == (None, None)
    # the operator started the node with a value (Ray then sets none): kept, even 1
    assert omp({"OMP_NUM_THREADS": "1", NODE_OMP_ENV: "1", "PATH": "/bin"}) == ("1", "node")
    assert omp({"OMP_NUM_THREADS": "3", NODE_OMP_ENV: "3", "PATH": "/bin"}) == ("3", "node")
    # the driver's own value wins over both: the same benchmark as a local run in that shell
    assert omp({"OMP_NUM_THREADS": "1", NODE_OMP_ENV: "", "PATH": "/bin"}, driver="2") == ("2", "driver")
    assert omp({"OMP_NUM_THREADS": "3", NODE_OMP_ENV: "3", "PATH": "/bin"}, driver="2") == ("2", "driver")
    # a node started by plain `ray start` (no marker): anything but Ray's cap is the operator's
    assert omp({"OMP_NUM_THREADS": "1", "PATH": "/bin"}) == (None, None)
    assert omp({"OMP_NUM_THREADS": "4", "PATH": "/bin"}) == ("4", "node")


def test_a_farm_node_tells_its_workers_the_operators_thread_setting(monkeypatch, tmp_path):
    """farm node passes the operator's OMP_NUM_THREADS (or "") to `ray start`, whose workers inherit it."""
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    from kernel_harness.farm import node as node_module
    from kernel_harness.farm.remote import NODE_OMP_ENV

    seen = []

    class Started(Exception):
        pass

    def fake_popen(cmd, **kwargs):
        seen.append(kwargs["env"])
        raise Started

    monkeypatch.setenv("KERNEL_HARNESS_FARM_DIR", str(tmp_path))
    monkeypatch.setattr(node_module.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(node_module, "_free_port_check", lambda host, port: None)
    for value in ("3", None):
        if value is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", value)
        with pytest.raises(Started):
            node_module.start_node(head=True, address=None, port=1, node_ip="127.0.0.1")
    assert [env[NODE_OMP_ENV] for env in seen] == ["3", ""]
    # and runs its workers, which run the benchmark, at its own niceness (Ray's default is 15)
    assert all(env["RAY_worker_niceness"] == "0" for env in seen)


def test_a_node_of_another_harness_or_torch_refuses_before_running_and_exits_2(tmp_path, capsys):
    from kernel_harness.farm import identity
    from kernel_harness.farm.remote import RemoteJob, run_job
    from kernel_harness.farm.submit import finish

    here = identity.local_identity()
    assert here.harness_source == identity.harness_source_id() and len(here.harness_source) == 12
    for field, other in (("harness_version", "0.0.9"), ("harness_source", "0123456789ab"),
                         ("torch_version", "2.99.0"), ("variant", "torch299-cxx98-cpu-x86_64-linux")):
        driver = identity.Identity(**{**here.as_json(), field: other})
        assert len(identity.differences(driver, here)) == 1
        # an empty package: had the node gone on to unpack and run it, the job would fail otherwise
        job = RemoteJob(b"", "pkg", "baseline.py", {}, (), 60.0, "any", expected=driver.as_json())
        outcome = run_job(job)
        assert outcome["status"] == "mismatch" and outcome["node_identity"] == here.as_json()
        assert outcome["driver_identity"][field] == other
        code = finish({**outcome, "label": "any"}, {}, "any", tmp_path / "r.json", 60.0, {})
        err = capsys.readouterr().err
        assert code == 2 and not (tmp_path / "r.json").exists()
        assert other in err and str(getattr(here, field)) in err and "Nothing was run or recorded" in err


def test_the_harness_code_hash_follows_the_code(monkeypatch, tmp_path):
    from kernel_harness.farm import identity

    (tmp_path / "kernel_harness" / "bench").mkdir(parents=True)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "kernel_harness" / "bench" / "runner.py").write_text("ROUNDS = 10\n")
    (tmp_path / "scripts" / "config.yaml").write_text("rtol: 0.01\n")
    monkeypatch.setattr(identity, "PROJECT_ROOT", tmp_path)
    monkeypatch.setattr(identity, "PACKAGE_DIR", tmp_path / "kernel_harness")
    monkeypatch.setattr(identity, "SCRIPTS_DIR", tmp_path / "scripts")
    first = identity.harness_source_id()
    (tmp_path / "scripts" / "config.yaml").write_text("rtol: 0.02\n")
    second = identity.harness_source_id()
    (tmp_path / "kernel_harness" / "bench" / "runner.py").write_text("ROUNDS = 11\n")
    assert len({first, second, identity.harness_source_id()}) == 3


def test_shipped_files_are_the_sources_one_variant_and_the_baselines_siblings(tmp_path):
    import io
    import tarfile

    from kernel_harness.farm.submit import baseline_files, pack

    package = tmp_path / "pkg"
    for rel in ("build.toml", "pkg_cpu/k.cpp", f"build/{VARIANT}/_ops.py", "build/torch299-cxx98-cpu-x86_64-linux/_ops.py",
                "build/.objs/k.o", "dist/pkg.whl", "torch-ext/pkg/__init__.py"):
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(rel)
    with tarfile.open(fileobj=io.BytesIO(pack(package, VARIANT)), mode="r:gz") as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
    assert names == {"build.toml", "pkg_cpu/k.cpp", f"build/{VARIANT}/_ops.py", "torch-ext/pkg/__init__.py"}
    # examples/rms_norm/baseline_large.py loads baseline.py beside it
    shipped = baseline_files(PROJECT_ROOT / "examples" / "rms_norm" / "baseline_large.py")
    assert {"baseline_large.py", "baseline.py"} <= set(shipped)
    assert shipped["baseline.py"] == BASELINE.read_bytes()


def _runs(side: str, speedups: list[float]):
    from kernel_harness.farm.agreement import Run

    return [Run(side, i, 0, 10.0 + (2.0 if side == "remote" else 0.0), x, None, True, 2, [1.0])
            for i, x in enumerate(speedups)]


def test_agreement_says_within_or_outside_only_when_the_whole_interval_does():
    from kernel_harness.farm.agreement import Run, compare

    local = [5.50, 5.62, 5.58, 5.71, 5.55, 5.66]
    same = compare(_runs("local", local) + _runs("remote", [x * 1.01 for x in reversed(local)]), {})
    assert same.verdict.startswith("within") and 0.95 <= same.ratio_ci[0] <= same.ratio <= same.ratio_ci[1] <= 1.05
    assert same.local.median == 5.6 and same.local.ok == 6 and same.overhead_s == 2.0
    far = compare(_runs("local", local) + _runs("remote", [x * 1.2 for x in local]), {})
    assert far.verdict.startswith("outside") and far.ratio == 1.2
    noisy = compare(_runs("local", local) + _runs("remote", [4.0, 7.5, 5.6, 6.9, 4.4]), {})
    assert noisy.verdict.startswith("undecided")
    one = compare(_runs("local", [5.6]) + _runs("remote", [5.6]), {})
    assert one.ratio == 1.0 and one.ratio_ci is None and one.verdict.startswith("undecided")
    # far apart but from too few runs, or from runs the benchmark marked unreliable: no verdict
    few = compare(_runs("local", [4.2, 4.8]) + _runs("remote", [6.1, 6.4]), {})
    assert few.ratio_ci is not None and few.verdict.startswith("undecided") and "at least 5" in few.verdict
    busy = [dataclasses.replace(r, reliable=False) for r in _runs("local", local) + _runs("remote", local[::-1])]
    assert compare(busy, {}).verdict.startswith("undecided") and compare(busy, {}).basis.startswith("every")
    crashed = Run("remote", 0, 3, 5.0, None, None, None, None, None, error="kernel failure")
    failed = compare(_runs("local", local) + [crashed], {})
    assert failed.remote.ok == 0 and failed.ratio is None and json.dumps(failed.as_json())


def _agreement_json(path, runs, cpu_model, target=None):
    from kernel_harness.farm.agreement import compare

    result = compare(runs, {"cpu_model": cpu_model})
    result.target = target
    path.write_text(json.dumps(result.as_json()))
    return path


def test_agreement_pools_earlier_series_of_the_same_target_on_this_cpu(tmp_path):
    """Two series neither of which decides alone (each +-4 % noisy) decide together;
    --runs 0 only recomputes. A file from another CPU model or target is refused (exit 2)."""
    model = cpu.cpu_model()
    target = {"baseline": str(BASELINE.resolve()), "kernel_package": str(tmp_path.resolve()), "op": "p.f",
              "benchmark_flags": []}
    local = [5.2, 5.0, 5.4, 5.1, 5.3, 4.9, 5.5, 5.2]
    first = _agreement_json(tmp_path / "a.json", _runs("local", local) + _runs("remote", [5.25, 4.95, 5.45, 5.0, 5.35, 5.05, 5.4, 5.1]),
                            model, target)
    second = _agreement_json(tmp_path / "b.json", _runs("local", local[::-1]) + _runs("remote", [5.1, 5.3, 5.0, 5.4, 5.2, 5.0, 5.3, 5.2]),
                             model)  # written before targets were recorded: taken on the caller's word
    out = tmp_path / "pooled.json"
    proc = run_script("farm_agreement", BASELINE, "--kernel-package", tmp_path, "--op", "p.f", "--cluster", "auto",
                      "--runs", "0", "--pool", first, second, "--json", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pooled = json.loads(out.read_text())
    assert pooled["local"]["runs"] == pooled["remote"]["runs"] == 16
    assert pooled["pooled_from"] == [str(first), str(second)] and pooled["target"] == target
    assert pooled["verdict"].startswith("within"), pooled["ratio_ci95"]
    elsewhere = _agreement_json(tmp_path / "c.json", _runs("local", local), "another CPU", target)
    proc = run_script("farm_agreement", BASELINE, "--kernel-package", tmp_path, "--op", "p.f", "--cluster", "auto",
                      "--runs", "0", "--pool", elsewhere, cwd=tmp_path)
    assert proc.returncode == 2 and "another CPU" in proc.stderr
    other = _agreement_json(tmp_path / "d.json", _runs("local", local), model, {**target, "op": "q.g"})
    proc = run_script("farm_agreement", BASELINE, "--kernel-package", tmp_path, "--op", "p.f", "--cluster", "auto",
                      "--runs", "0", "--pool", other, cwd=tmp_path)
    assert proc.returncode == 2 and "same baseline, kernel, op" in proc.stderr


def test_agreement_alternates_the_first_side_and_stops_at_a_refused_run(tmp_path):
    from kernel_harness.farm.agreement import run_pairs

    log = tmp_path / "order.txt"
    fake = ("import json, sys; open(%r, 'a').write(sys.argv[1] + ' '); "
            "json.dump({'speedup': 2.0, 'reliable': True, 'threads': 2, 'remote': {'node': 'n', 'wall_s': 1.5, "
            "'driver_wall_s': 1.75}} "
            "if sys.argv[1] != 'bad' else {}, open(sys.argv[sys.argv.index('--json') + 1], 'w')); "
            "sys.exit(2 if sys.argv[1] == 'bad' else 0)") % str(log)
    runs = run_pairs([sys.executable, "-c", fake, "L"], [sys.executable, "-c", fake, "R"], 3, 60)
    assert log.read_text().split() == ["L", "R", "R", "L", "L", "R"]
    assert [r.side for r in runs] == ["local", "remote", "remote", "local", "local", "remote"]
    assert all(r.speedup == 2.0 and r.returncode == 0 for r in runs) and runs[1].node == "n"
    assert (runs[1].node_wall_s, runs[1].driver_wall_s) == (1.5, 1.75)
    with pytest.raises(UsageError, match="remote run refused its input"):
        run_pairs([sys.executable, "-c", fake, "L"], [sys.executable, "-c", fake, "bad"], 3, 60)
    assert log.read_text().split()[6:] == ["L", "bad"]


def test_agreement_script_refuses_bad_usage(tmp_path):
    proc = run_script("farm_agreement", BASELINE, "--kernel-package", tmp_path, "--op", "p.f", "--cluster", "auto",
                      "--runs", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "--runs must be at least 1 (or 0 with --pool)" in proc.stderr
    proc = run_script("farm_agreement", BASELINE, "--kernel-package", tmp_path, "--op", "p.f", "--cluster", "auto",
                      "--", "--json", "x.json", cwd=tmp_path)
    assert proc.returncode == 2 and "no --json" in proc.stderr


@needs_ray
def test_no_cluster_at_the_address_exits_2_at_once(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    address = f"127.0.0.1:{port}"
    start = time.monotonic()
    # the kernel directory is checked before connecting: a minimal one with a build variant
    fake = tmp_path / "pkg"
    (fake / "build" / VARIANT).mkdir(parents=True)
    (fake / "build.toml").write_text('[general]\nname = "pkg"\n')
    proc = run_script("benchmark_cpu", BASELINE, "--kernel-package", fake, "--op", "pkg.f",
                      "--cluster", address, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert address in proc.stderr and "kernel_harness.farm node --head" in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - start < 60


# --------------------------------------------------------------------------- a local head

def _farm(env: dict, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_harness.farm", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=PROJECT_ROOT)


@pytest.fixture(scope="module")
def farm_head(tmp_path_factory):
    """A one-slot Ray head for the module; always stopped (by its pid) at the end."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install -e '.[cluster]')")
    state = tmp_path_factory.mktemp("farm-state")
    ray_tmp = tempfile.mkdtemp(prefix="khray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hidden = cpu.REQUIRED_FLAGS["amx"]
    env = {**os.environ, "KERNEL_HARNESS_FARM_DIR": str(state), "PYTHONPATH": str(PROJECT_ROOT),
           # the node advertises no AMX on any CPU, so "a class the cluster lacks" is always amx
           cpu.FLAGS_ENV_VAR: " ".join(sorted(cpu.cpu_flags() - hidden))}
    try:
        proc = _farm(env, "node", "--head", "--port", str(port), "--temp-dir", ray_tmp, "--start-timeout", "150")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        address = json.loads((state / "node.json").read_text())["address"]
        # rich wraps long lines at spaces: compare with the whitespace folded
        assert address.endswith(f":{port}") and f"--address {address}" in " ".join(proc.stdout.split())
        yield {"address": address, "host": address.rpartition(":")[0], "env": env, "state": state}
    finally:
        _stop_node(env, state)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _bench(farm, kernel_dir: Path, json_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "scripts" / "benchmark_cpu.py"), str(BASELINE), "--kernel-package",
         str(kernel_dir), "--op", OP, *FAST, "--cluster", farm["address"], "--json", str(json_path), *extra],
        env=env or farm["env"], cwd=json_path.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_status_lists_the_node_its_classes_and_its_slot(farm_head, tmp_path):
    proc = _farm(farm_head["env"], "status", "--cluster", farm_head["address"], "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    [node] = json.loads((tmp_path / "s.json").read_text())["nodes"]
    assert node["slots"] == 1 and node["free_slots"] == 1 and node["address"] == farm_head["host"]
    assert list(node["classes"]) == [c for c in ("avx2", "avx512") if cpu.has_isa(c)]
    assert node["variant"] and node["variant"].startswith("torch")


@pytest.fixture(scope="module")
def three_runs(farm_head, catalogue_kernel_dir, tmp_path_factory):
    """Three --cluster runs submitted at once against the one-slot node."""
    out = tmp_path_factory.mktemp("three-runs")
    # the third is an --all-cpu-classes run: one job per class (one class here), written as run2.<class>.json
    # the second times the same build --against itself where benchmark_cpu.py has --against (issue 19)
    # (its rounds kept to the usual ones: --against-max-s 0 travels to the node like any flag)
    extra = {1: ["--against", str(catalogue_kernel_dir), "--against-max-s", "0"] if _has_against() else [],
             2: ["--all-cpu-classes"]}
    # the third sets OMP_NUM_THREADS=1 in the driver's shell: the node must time one thread, as locally
    envs = {2: {**farm_head["env"], "OMP_NUM_THREADS": "1"}}
    procs = [_bench(farm_head, catalogue_kernel_dir, out / f"run{i}.json", *extra.get(i, []), env=envs.get(i))
             for i in range(3)]
    results = []
    for i, proc in enumerate(procs):
        try:
            stdout, stderr = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("three queued remote runs did not finish within 15 minutes")
        data = out / f"run{i}.json"
        if i == 2:
            written = sorted(out.glob("run2.*.json"))
            assert len(written) == 1, (written, stdout + stderr)
            data = written[0]
            assert data.name == f"run2.{json.loads(data.read_text())['remote']['cpu_class']}.json"
        results.append((proc.returncode, stdout + stderr, json.loads(data.read_text()) if data.exists() else None))
    return results


def _has_against() -> bool:
    return "--against" in (PROJECT_ROOT / "scripts" / "benchmark_cpu.py").read_text()


@pytest.mark.slow
def test_against_ships_the_other_build_and_names_the_local_one(three_runs, catalogue_kernel_dir):
    if not _has_against():
        pytest.skip("this benchmark_cpu.py has no --against (issue 19) yet")
    code, output, report = three_runs[1]
    assert code == 0 and report is not None, output[-3000:]
    vs = report["vs_against"]
    assert vs is not None and vs["against"] == str(catalogue_kernel_dir) and vs["ratio"] > 0
    assert report["remote"]["node_paths"]["against"] != vs["against"]
    # --against-max-s 0 reached the node: only the usual rounds ran there
    assert vs["rounds"]["stopped"] == "disabled" and vs["rounds"]["added_rounds"] == 0
    if vs.get("against_build_id") is not None:
        assert vs["against_build_id"] == report["kernel_build"]["build_id"]


@pytest.mark.slow
def test_the_drivers_omp_num_threads_applies_on_the_node(three_runs):
    code, output, report = three_runs[2]
    assert code == 0 and report is not None, output[-3000:]
    assert report["threads"] == 1 and report["remote"]["threads"] == {"omp_num_threads": "1", "source": "driver"}


@pytest.mark.slow
def test_concurrent_runs_on_one_slot_never_overlap(three_runs):
    spans = []
    for code, output, report in three_runs:
        assert code == 0 and report is not None, output[-3000:]
        remote = report["remote"]
        spans.append((datetime.fromisoformat(remote["started_at"]), datetime.fromisoformat(remote["finished_at"])))
    spans.sort()
    for (_, end), (next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start, f"two benchmarks shared the node: {spans}"


@pytest.mark.slow
def test_remote_run_returns_the_local_schema_and_is_matched_with_its_trial(three_runs, catalogue_kernel_dir, tmp_path,
                                                                            farm_head):
    from kernel_harness.trials.buildid import content_id_of
    from kernel_harness.trials.results import json_build_id

    code, output, remote_report = three_runs[0]
    assert code == 0, output[-3000:]
    proc = run_script("benchmark_cpu", BASELINE, "--kernel-package", catalogue_kernel_dir, "--op", OP, *FAST,
                      "--json", tmp_path / "local.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    local = json.loads((tmp_path / "local.json").read_text())
    assert set(remote_report) - {"remote"} == set(local)
    assert remote_report["correct"] is True and remote_report["speedup"] > 0
    # the same thread count as a local run on the same machine (Ray's task cap is dropped)
    assert remote_report["threads"] == local["threads"]
    # the node ran the driver's harness code and torch (checked on the node before it ran)
    from kernel_harness.farm.identity import local_identity

    assert remote_report["remote"]["identity"] == local_identity().as_json()
    # the benchmark ran at the priority of the process that started the node, not Ray's worker nice 15
    assert remote_report["remote"]["nice"] == os.nice(0)
    driver_omp = os.environ.get("OMP_NUM_THREADS") or None
    assert remote_report["remote"]["threads"] == {"omp_num_threads": driver_omp,
                                                  "source": "driver" if driver_omp else None}
    remote = remote_report["remote"]
    assert remote["node_ip"] == farm_head["host"] and remote["node"] == socket.gethostname()
    assert remote["cpu_class"] in ("generic", "avx2", "avx512") and remote["wall_s"] > 0
    assert remote_report["machine"]["cpu_model"] == cpu.cpu_model()  # the node's CPU, recorded by the node
    if "conditions" in remote_report:  # issue 19's conditions, measured on the node
        assert remote_report["conditions"]["cpu_model"] == cpu.cpu_model()
    assert remote_report["baseline_file"] == str(BASELINE)  # the caller's file, which finalize hashes
    # the node ran the shipped build: a trial of these sources accepts the JSON like a local one
    assert json_build_id(remote_report) in (None, content_id_of(catalogue_kernel_dir))
    assert run_script("trial_manager", "init", "rms", BASELINE, cwd=tmp_path).returncode == 0
    assert run_script("trial_manager", "save", "rms", catalogue_kernel_dir, "--strategy", "farm",
                      cwd=tmp_path).returncode == 0
    (tmp_path / "remote.json").write_text(json.dumps(remote_report))
    proc = run_script("trial_manager", "result", "rms", "t0", "--from-json", tmp_path / "remote.json",
                      "--accept-unreliable", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# amx is hidden on the test node; avx512 is missing too where the CPU lacks the tier (Ice Lake, Zen 3)
@pytest.mark.slow
@pytest.mark.parametrize("missing", ["amx", *([] if cpu.has_isa("avx512") else ["avx512"])])
def test_a_class_the_cluster_lacks_exits_2_at_once(farm_head, catalogue_kernel_dir, tmp_path, missing):
    start = time.monotonic()
    proc = _bench(farm_head, catalogue_kernel_dir, tmp_path / "r.json", "--cpu-class", missing)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stdout + stderr
    has = [c for c in ("avx2", "avx512") if cpu.has_isa(c)]
    assert f"CPU class {missing}" in stderr and f"its nodes have {', '.join(has) or 'no AVX2'}" in stderr
    assert not (tmp_path / "r.json").exists() and time.monotonic() - start < 90


@pytest.mark.slow
def test_a_package_of_another_variant_exits_2_naming_both(farm_head, catalogue_kernel_dir, tmp_path):
    other = "torch299-cxx98-cpu-x86_64-linux"
    package = tmp_path / "pkg"
    package.mkdir()
    shutil.copy(catalogue_kernel_dir / "build.toml", package / "build.toml")
    [variant] = [p for p in (catalogue_kernel_dir / "build").iterdir() if p.name.startswith("torch")]
    shutil.copytree(variant, package / "build" / other)
    proc = _bench(farm_head, package, tmp_path / "r.json")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stdout + stderr
    assert other in stderr and variant.name in stderr and not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_a_job_over_its_timeout_exits_3_naming_the_node(farm_head, catalogue_kernel_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / "benchmark_cpu.py"), str(BASELINE), "--kernel-package",
         str(catalogue_kernel_dir), "--op", OP, *FAST, "--cluster", "auto", "--job-timeout", "2",
         "--json", str(tmp_path / "r.json")],
        env=farm_head["env"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "--job-timeout 2 s" in proc.stderr and farm_head["host"] in proc.stderr
    assert not (tmp_path / "r.json").exists()


def _benchmark_child(marker: str, timeout: float = 240) -> tuple[int, int]:
    """(pid, parent pid) of the node's benchmark subprocess whose command line holds ``marker``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if "benchmark_cpu.py" in cmdline and "kh-farm-" in cmdline and marker in cmdline:
                return int(entry.name), int(stat.rsplit(")", 1)[1].split()[1])
        time.sleep(0.5)
    pytest.fail("the remote benchmark never started on the node")


@pytest.mark.slow
def test_killing_the_worker_mid_run_exits_3_and_records_nothing(farm_head, catalogue_kernel_dir, tmp_path):
    marker = "--seed 424242"  # forwarded to the node: finds this run's benchmark process
    json_path = tmp_path / "r.json"
    proc = _bench(farm_head, catalogue_kernel_dir, json_path, "--seed", "424242", "--rounds", "200")
    try:
        child, worker = _benchmark_child(marker)
        os.kill(worker, signal.SIGKILL)  # the Ray worker running the job: as if the node died under it
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stdout + stderr
    assert farm_head["host"] in stderr and "Nothing was recorded" in stderr
    assert not json_path.exists()  # nothing a trial could be fed with
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


# --------------------------------------------------------------------------- a second node joins

@pytest.fixture(scope="module")
def second_node(farm_head, tmp_path_factory):
    """A second farm node on this machine joins the head with `farm node --address` (after every
    one-node test: this module's tests run in file order).  It hides AVX2 and up, so it is a node of
    another class (generic); its own state directory, so `farm stop` there stops only it."""
    if not cpu.has_isa("avx2"):
        pytest.skip("the head is generic on this CPU: the joining node would not be of another class")
    state = tmp_path_factory.mktemp("farm-state-2")
    hidden = set().union(*(cpu.REQUIRED_FLAGS[name] for name in ("avx2", "avx512", "amx")))
    env = {**farm_head["env"], "KERNEL_HARNESS_FARM_DIR": str(state),
           cpu.FLAGS_ENV_VAR: " ".join(sorted(cpu.cpu_flags() - hidden))}
    try:
        proc = _farm(env, "node", "--address", farm_head["address"], "--start-timeout", "150")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"Joined the cluster at {farm_head['address']}" in " ".join(proc.stdout.split())
        yield {"env": env, "state": state}
    finally:
        _stop_node(env, state)


def _stop_node(env: dict[str, str], state: Path) -> None:
    """`farm stop`; if that failed, end exactly the process the test started."""
    _farm(env, "stop", timeout=90)
    data = state / "node.json"
    if data.exists():
        try:
            os.killpg(json.loads(data.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, KeyError, ValueError):
            pass


def _head_top() -> str:
    return "avx512" if cpu.has_isa("avx512") else "avx2"  # amx is hidden on the head


@pytest.mark.slow
def test_a_joined_node_is_listed_with_its_class_and_its_own_slot(farm_head, second_node, tmp_path):
    proc = _farm(farm_head["env"], "status", "--cluster", farm_head["address"], "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    nodes = json.loads((tmp_path / "s.json").read_text())["nodes"]
    assert len(nodes) == 2 and len({n["node_id"] for n in nodes}) == 2
    by_top = {n["top"]: n for n in nodes}
    assert set(by_top) == {_head_top(), "generic"}
    assert by_top["generic"]["classes"] == [] and _head_top() in by_top[_head_top()]["classes"]
    assert all(n["slots"] == 1 and n["free_slots"] == 1 and n["variant"] == nodes[0]["variant"] for n in nodes)
    assert "2 node(s), 2 bench slot(s), 0 busy" in proc.stdout


@pytest.mark.slow
def test_two_jobs_submitted_at_once_run_one_per_node(farm_head, second_node, catalogue_kernel_dir, tmp_path):
    """--all-cpu-classes submits one job per class at once; each runs on the node of its class."""
    # one thread each: the two nodes share this machine's cores (a test of the scheduling, not a timing)
    proc = _bench(farm_head, catalogue_kernel_dir, tmp_path / "run.json", "--all-cpu-classes", "--threads", "1")
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, (stdout + stderr)[-3000:]
    reports = {c: json.loads((tmp_path / f"run.{c}.json").read_text()) for c in (_head_top(), "generic")}
    assert len({r["remote"]["node_id"] for r in reports.values()}) == 2, "both jobs ran on one node"
    for cls, report in reports.items():
        assert report["correct"] is True and report["remote"]["cpu_class"] == cls
    # the generic node hid AVX2 from the harness: its own report says so (the node's machine, not the driver's)
    assert reports["generic"]["machine"]["supported_tiers"] == ["generic"]
    assert "avx2" in reports[_head_top()]["machine"]["supported_tiers"]
