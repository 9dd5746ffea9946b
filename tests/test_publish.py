"""scripts/publish.py: staging, fresh-process verification, the card, benchmarks, upload.

Most tests use a stand-in kernel (tests/data/publish/tiny_kernel) whose build
variant is pure Python, so the publisher's own logic is tested in seconds.
The real catalogue kernel (the shared ``catalogue_kernel_dir`` fixture) is
published in a dry run by the slow test at the end.  The upload is checked
against huggingface_hub's real client code talking to a fake Hub on loopback
(tests/data/publish/fake_hub.py); no test touches the network.  The fake Hub
answers "regular" to every preupload, so the LFS/Xet transfer the real Hub
asks for large binaries is not exercised here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from kernel_harness.build.variant_digest import write_digest
from kernel_harness.errors import ExitCode, HarnessError, UsageError
from kernel_harness.paths import PROJECT_ROOT, SCRIPTS_DIR
from kernel_harness.publish import PublishOptions, publish
from kernel_harness.publish.layout import expected_build_id
from kernel_harness.publish.staging import STAGE_MARKER, list_stage_files
from kernel_harness.publish.upload import upload_stage

DATA = Path(__file__).parent / "data" / "publish"


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's user agent would fetch an agent registry from the (real) endpoint."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
sys.path.insert(0, str(DATA))
from fake_hub import GOOD_TOKEN, FakeHub  # noqa: E402

PUBLISH = SCRIPTS_DIR / "publish.py"
BENCHMARK_CPU_EXISTS = (SCRIPTS_DIR / "benchmark_cpu.py").is_file()


def variant_name() -> str:
    """The build variant kernels would pick for the running torch (what the builder writes)."""
    major, minor = torch.__version__.split(".")[:2]
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    return f"torch{major}{minor}-{abi}-cpu-{os.uname().machine}-linux"


def make_tiny_kernel(dest: Path, *, broken_import: bool = False, stale: bool = False) -> Path:
    """Copy the stand-in kernel and put its variant under build/ (the repo ignores build/).

    Its metadata id gets the content id scripts/build_kernel.py would give these
    sources (unless ``stale``), so the publisher sees an up-to-date build.
    """
    shutil.copytree(DATA / "tiny_kernel", dest)
    variant = dest / "build" / variant_name()
    variant.parent.mkdir()
    (dest / "variant").rename(variant)
    build_id = expected_build_id(dest)
    if build_id is not None:
        meta = json.loads((variant / "metadata.json").read_text())
        meta["id"] = f"_tiny_kernel_cpu_{'0000000000' if stale else build_id}"
        (variant / "metadata.json").write_text(json.dumps(meta))
    if broken_import:
        (variant / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3fooE')\n")
    write_digest(variant)  # what scripts/build_kernel.py records as its last step
    # copytree keeps the data files' times; make the build newer than the sources
    # so the publisher does not try to rebuild the stand-in.
    newest = max(p.stat().st_mtime for p in dest.rglob("*") if p.is_file()) + 10
    for path in variant.rglob("*"):
        os.utime(path, (newest, newest))
    return dest


def make_output_dir(dest: Path) -> Path:
    """A finalized output/ as trial_manager.py finalize writes it (plus the build)."""
    make_tiny_kernel(dest)
    shutil.copy(DATA / "tiny_baseline.py", dest / "baseline.py")
    summary = {
        "best_trial": "t2",
        "baseline_us": 41.5,
        "kernel_us": 12.25,
        "speedup": 3.39,
        "baseline_file": str(DATA / "tiny_baseline.py"),
        "trials": [
            {"id": "t0", "result": None},
            {"id": "t1", "result": None},
            {
                "id": "t2",
                "result": {
                    "correct": True,
                    "details": {
                        "machine": {"cpu_model": "Test CPU X", "logical_cpus": 2},
                        "threads": 2,
                        "pinned": True,
                        "acceptance_rule": "as-accurate-as-baseline",
                    },
                },
            },
        ],
    }
    (dest / "summary.json").write_text(json.dumps(summary))
    (dest / "summary.md").write_text("# summary\n")
    return dest


def run_publish(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Telemetry off: huggingface_hub would otherwise ask HF_ENDPOINT for its agent registry.
    full_env = {**os.environ, "COLUMNS": "200", "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(PUBLISH), *map(str, args), "--rounds", "3"],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One dry run from a finalized output dir, shared by the read-only checks below."""
    work = tmp_path_factory.mktemp("publish-dry")
    output = make_output_dir(work / "output")
    proc = run_publish(output, "--repo-id", "me/tiny-kernel", "--dry-run", "--json", work / "r.json", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((work / "r.json").read_text())
    return {"work": work, "proc": proc, "report": report, "stage": Path(report["stage_dir"])}


# -- staging -----------------------------------------------------------------


def test_dry_run_stages_the_hub_layout_and_lists_every_file(dry_run: dict) -> None:
    stage, report, proc = dry_run["stage"], dry_run["report"], dry_run["proc"]
    v = variant_name()
    assert report["files"] == sorted(
        [
            "LICENSE", "README.md", "benchmarks/benchmark.py", "build.toml",
            f"build/{v}/__init__.py", f"build/{v}/_ops.py", f"build/{v}/metadata.json",
            f"build/{v}/tiny_kernel/__init__.py",
            "tiny_kernel_cpu/tiny_kernel_avx512.cpp", "tiny_kernel_cpu/tiny_kernel_cpu.cpp",
            "torch-ext/tiny_kernel/__init__.py", "torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h",
        ]
    )  # fmt: skip
    assert list_stage_files(stage) == report["files"]
    # summary.json/summary.md/baseline.py of the output dir are not part of the Hub repository
    assert not (stage / "summary.json").exists() and not (stage / "baseline.py").exists()
    assert report["uploaded"] is False and report["dry_run"] is True and report["error"] is None
    assert report["branch"] == "v1" and report["function"] == "tiny_kernel.rms_norm"
    # the best trial passed under --accept-if-as-accurate, so the publish-time check reuses that rule
    assert any("--accept-if-as-accurate" in note for note in report["notes"])
    # the dry run lists every file and prints the card
    for name in report["files"]:
        assert name in proc.stdout
    assert "Dry run" in proc.stdout and "Python API" in proc.stdout
    assert "hf upload me/tiny-kernel" in proc.stdout


def test_staged_repo_loads_in_a_fresh_process_and_passes_checks(dry_run: dict) -> None:
    verification = dry_run["report"]["verification"]
    assert verification["load"]["ok"] is True
    assert "rms_norm" in verification["load"]["functions"]
    assert verification["load"]["file"].startswith(str(dry_run["stage"]))  # the staged copy, not the source
    assert verification["kernels_benchmark"] == "pass"
    assert verification["correctness"] == ("pass" if BENCHMARK_CPU_EXISTS else "skipped")
    if not BENCHMARK_CPU_EXISTS:
        assert any("SKIPPED" in line and "benchmark_cpu.py" in line for line in verification["lines"])


def test_output_dir_without_a_build_is_built_with_the_configured_command(tmp_path: Path) -> None:
    """finalize copies only sources; publish runs build_command there (a stand-in builder here)."""
    output = make_output_dir(tmp_path / "output")
    shutil.rmtree(output / "build")
    config = yaml.safe_load((SCRIPTS_DIR / "config.yaml").read_text())
    config["build_command"] = f"{{python}} {DATA / 'fake_build.py'}"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = run_publish(
        output, "--repo-id", "me/tiny-kernel", "--dry-run", "--json", tmp_path / "r.json", cwd=tmp_path,
        env={"KERNEL_HARNESS_CONFIG": str(tmp_path / "config.yaml")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fake build: wrote" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert any(note.startswith("built with") for note in report["notes"])
    assert f"build/{variant_name()}/metadata.json" in report["files"]
    assert report["verification"]["kernels_benchmark"] == "pass"


def test_kernel_dir_without_a_baseline_is_refused(tmp_path: Path) -> None:
    kernel = make_tiny_kernel(tmp_path / "k")
    proc = run_publish(kernel, "--repo-id", "me/tiny-kernel", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--baseline" in proc.stderr and "Traceback" not in proc.stderr


def test_stage_refuses_to_empty_a_directory_it_did_not_create(tmp_path: Path) -> None:
    kernel = make_tiny_kernel(tmp_path / "k")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    proc = run_publish(
        kernel, "--repo-id", "me/tiny-kernel", "--dry-run", "--baseline", DATA / "tiny_baseline.py",
        "--stage", precious, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert (precious / "thesis.tex").read_text() == "do not delete"


def test_build_from_other_sources_is_rebuilt_or_refused(tmp_path: Path) -> None:
    kernel = make_tiny_kernel(tmp_path / "k", stale=True)
    if expected_build_id(kernel) is None:
        pytest.skip("the builder's content id is not available in this checkout")
    proc = run_publish(
        kernel, "--repo-id", "me/tiny-kernel", "--dry-run", "--no-build", "--baseline", DATA / "tiny_baseline.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "content id" in proc.stderr and "--no-build" in proc.stderr


def test_version_that_disagrees_with_the_build_metadata_is_refused(tmp_path: Path) -> None:
    kernel = make_tiny_kernel(tmp_path / "k")
    proc = run_publish(
        kernel, "--repo-id", "me/tiny-kernel", "--dry-run", "--version", "2",
        "--baseline", DATA / "tiny_baseline.py", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "version 1" in proc.stderr and "rebuild" in proc.stderr


def test_build_without_a_digest_is_rebuilt_or_refused(tmp_path: Path) -> None:
    kernel = make_tiny_kernel(tmp_path / "k")
    metadata = kernel / "build" / variant_name() / "metadata.json"
    meta = json.loads(metadata.read_text())
    del meta["digest"]  # as builds made before the builder recorded one
    metadata.write_text(json.dumps(meta))
    proc = run_publish(
        kernel, "--repo-id", "me/tiny-kernel", "--dry-run", "--no-build",
        "--baseline", DATA / "tiny_baseline.py", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "has no content digest" in proc.stderr and "drop --no-build" in " ".join(proc.stderr.split())


def test_card_states_the_digest_algorithm_and_that_the_build_is_unsigned(dry_run: dict) -> None:
    stage, report = dry_run["stage"], dry_run["report"]
    integrity = report["integrity"]
    assert integrity["ok"] is True and integrity["signed"] is False and integrity["algorithm"] == "sha256"
    assert integrity["variants"][0]["variant"] == variant_name() and integrity["variants"][0]["files"] >= 3
    card = (stage / "README.md").read_text()
    assert "sha256 digest" in card and "**unsigned**" in card and "metadata.json.sigstore" in card
    assert integrity["line"] in card  # listed under "Verification before publishing"
    assert not list(stage.rglob("*.sigstore"))  # never fabricated
    assert f"✓ {integrity['line'][:40]}" in dry_run["proc"].stdout


def test_unloadable_stage_exits_3_and_uploads_nothing(tmp_path: Path) -> None:
    output = make_output_dir(tmp_path / "output")
    make_tiny_kernel(tmp_path / "broken", broken_import=True)
    shutil.rmtree(output / "build")
    shutil.copytree(tmp_path / "broken" / "build", output / "build")
    with FakeHub() as hub:
        proc = run_publish(
            output, "--repo-id", "me/tiny-kernel", "--json", tmp_path / "r.json", cwd=tmp_path,
            env={"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": GOOD_TOKEN},
        )  # fmt: skip
        assert hub.requests == []
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "get_local_kernel" in proc.stderr and "undefined symbol" in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["uploaded"] is False and report["exit_code"] == 3 and report["stage_dir"]


def test_incorrect_kernel_exits_1_and_uploads_nothing(tmp_path: Path) -> None:
    output = make_output_dir(tmp_path / "output")
    with FakeHub() as hub:
        proc = run_publish(
            output, "--repo-id", "me/tiny-kernel", cwd=tmp_path,
            env={"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": GOOD_TOKEN, "TINY_KERNEL_BREAK": "1"},
        )  # fmt: skip
        assert hub.requests == []
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Nothing was uploaded" in proc.stderr


# -- card --------------------------------------------------------------------


def _tables(markdown: str) -> list[list[str]]:
    tables: list[list[str]] = []
    current: list[str] = []
    for line in markdown.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def test_card_is_structured_markdown_with_the_measured_table(dry_run: dict) -> None:
    card = (dry_run["stage"] / "README.md").read_text()
    # YAML front matter the Hub reads
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "kernels" and "kernels" in front["tags"] and front["license"] == "apache-2.0"
    # headings: one title, the documented sections, no unfilled placeholder
    body = card.split("---\n", 2)[2]
    fence_free = re.sub(r"```.*?```", "", body, flags=re.S)
    headings = re.findall(r"^(#{1,6}) (.+)$", fence_free, flags=re.M)
    assert [h for level, h in headings if level == "#"] == ["tiny_kernel"]
    for section in ("How to load it", "Python API", "What it runs on", "Benchmarks", "Verification before publishing",
                    "What this build does and does not guarantee"):  # fmt: skip
        assert ("##", section) in headings
    assert body.count("```") % 2 == 0
    assert not re.search(r"\$\{?\w+\}?", fence_free.replace("$$", ""))
    # every table is rectangular; the benchmark table has a row per measurement
    for table in _tables(body):
        widths = {row.count("|") for row in table}
        assert len(widths) == 1, table
        assert re.fullmatch(r"\|( ?:?-+:? ?\|)+", table[1].replace(" ", "")), table
    bench = next(t for t in _tables(body) if "Speedup" in t[0])
    assert len(bench) == 2 + (2 if BENCHMARK_CPU_EXISTS else 1)
    assert "| finalized trial t2 (2 threads, pinned) | bfloat16 8x64 | 41.5 | 12.2 | 3.39x | Test CPU X, 2 logical CPUs |" in bench
    # the API and the load snippet
    assert "`rms_norm(x, weight, eps, out=None)`" in card
    assert 'get_kernel("me/tiny-kernel", version=1, trust_remote_code=True)' in card
    # the load snippet runs: it calls the function at the baseline's headline shapes
    snippet = re.search(r"```python\n(.*?)```", card, flags=re.S).group(1)
    assert "x = torch.randn((8, 64), dtype=torch.bfloat16)" in snippet
    assert "y = tiny_kernel.rms_norm(x, weight, eps)" in snippet
    assert "`bfloat16`, `float32`" in card and variant_name() in card
    assert "kernel-builder" in card and "manylinux_2_28" in card


def test_card_load_snippet_runs_against_the_stage(dry_run: dict) -> None:
    """The card's snippet, verbatim, with LOCAL_KERNELS mapping the repo id to the stage."""
    card = (dry_run["stage"] / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", card, flags=re.S).group(1)
    env = {**os.environ, "LOCAL_KERNELS": f"me/tiny-kernel={dry_run['stage']}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", snippet + "\nprint(tuple(y.shape), y.dtype)"],
        cwd=dry_run["work"], env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("(8, 64) torch.bfloat16")


# -- benchmarks/benchmark.py ---------------------------------------------------


def test_benchmark_file_passes_under_the_kernels_benchmark_code_path(dry_run: dict) -> None:
    from kernel_harness.publish.kernels_cli import benchmark_runner

    runner = benchmark_runner()
    stage = dry_run["stage"]
    scripts = runner.discover_benchmark_scripts(str(stage), stage)
    assert scripts == [stage / "benchmarks" / "benchmark.py"]
    (cls,) = runner.discover_benchmark_classes(scripts[0], stage)
    workloads = sorted(n.removeprefix("benchmark_") for n in dir(cls) if n.startswith("benchmark_"))
    # headline + the largest correctness case per dtype, each a full triple
    assert workloads == ["bfloat16_1x64", "float32_1x64", "headline_bfloat16_8x64"]
    for name in workloads:
        assert callable(getattr(cls, f"setup_{name}")) and callable(getattr(cls, f"verify_{name}"))
    results, _sha = runner.run_benchmark_script(
        scripts[0], iterations=2, warmup=1, cwd=stage, repo_id=str(stage), is_local=True, revision="local"
    )
    assert {name: t.verified for name, t in results.items()} == {f"{cls.__name__}.{w}": True for w in workloads}


def test_a_kernels_without_a_known_benchmark_runner_is_named_in_the_error(monkeypatch) -> None:
    from kernel_harness.publish import kernels_cli

    assert callable(kernels_cli.benchmark_runner().run_benchmark_script)  # the installed kernels has one
    monkeypatch.setattr(kernels_cli, "BENCHMARK_MODULES", ("kernels.no_such_cli.benchmark", "json"))
    with pytest.raises(kernels_cli.BenchmarkRunnerMissing) as info:
        kernels_cli.benchmark_runner()
    import kernels

    message = str(info.value)
    assert kernels.__version__ in message and "kernels.no_such_cli.benchmark" in message and "pip install" in message


# -- upload against the fake Hub ----------------------------------------------


def _upload(stage: Path, report: dict, hub: FakeHub, **kwargs) -> object:
    return upload_stage(
        stage, report["files"], repo_id="me/tiny-kernel", branch="v1", variants=[variant_name()], version=1,
        token=kwargs.pop("token", GOOD_TOKEN), endpoint=kwargs.pop("endpoint", None) or hub.endpoint, **kwargs,
    )  # fmt: skip


def test_upload_sequence_creates_repo_branch_and_commits_build_then_card(dry_run: dict) -> None:
    stage, report = dry_run["stage"], dry_run["report"]
    with FakeHub() as hub:
        result = _upload(stage, report, hub)
        assert hub.calls() == [
            "POST /api/repos/create",
            "GET /api/kernels/me/tiny-kernel/refs",
            "POST /api/kernels/me/tiny-kernel/branch/v1",
            "POST /api/validate-yaml",
            "POST /api/kernels/me/tiny-kernel/preupload/v1",
            "POST /api/kernels/me/tiny-kernel/commit/v1",
            "POST /api/validate-yaml",
            "POST /api/kernels/me/tiny-kernel/preupload/main",
            "POST /api/kernels/me/tiny-kernel/commit/main",
        ]
        assert hub.requests[0].body["type"] == "kernel" and hub.requests[0].body["name"] == "tiny-kernel"
        repo = hub.repos["me/tiny-kernel"]
        assert repo.repo_type == "kernel"
        assert sorted(set(repo.branches["v1"]) - {".gitattributes"}) == report["files"]
        assert sorted(repo.branches["main"]) == [".gitattributes", "LICENSE", "README.md"]
        assert repo.branches["main"]["README.md"] == (stage / "README.md").read_bytes()
        so_like = f"build/{variant_name()}/metadata.json"
        assert repo.branches["v1"][so_like] == (stage / so_like).read_bytes()
        assert STAGE_MARKER not in repo.branches["v1"]
    assert result.created_branch is True and [c["branch"] for c in result.commits] == ["v1", "main"]
    assert result.repo_url.endswith("/kernels/me/tiny-kernel")


def test_second_upload_deletes_stale_files_of_the_variant(dry_run: dict) -> None:
    stage, report = dry_run["stage"], dry_run["report"]
    with FakeHub() as hub:
        _upload(stage, report, hub)
        old_so = f"build/{variant_name()}/_tiny_kernel_cpu_deadbee.abi3.so"
        hub.repos["me/tiny-kernel"].branches["v1"][old_so] = b"\x7fELF old build"
        hub.repos["me/tiny-kernel"].branches["v1"]["notes/keep.txt"] = b"not ours to delete"
        hub.requests.clear()
        result = _upload(stage, report, hub)
        assert "POST /api/kernels/me/tiny-kernel/branch/v1" not in hub.calls()
        assert "GET /api/kernels/me/tiny-kernel/tree/v1" in hub.calls()
        v1 = hub.repos["me/tiny-kernel"].branches["v1"]
        assert old_so not in v1 and "notes/keep.txt" in v1
    assert result.deleted == [old_so] and result.created_branch is False


def test_branch_main_puts_everything_in_one_commit_on_main(dry_run: dict) -> None:
    stage, report = dry_run["stage"], dry_run["report"]
    with FakeHub() as hub:
        result = upload_stage(
            stage, report["files"], repo_id="me/tiny-kernel", branch="main", variants=[variant_name()], version=1,
            token=GOOD_TOKEN, endpoint=hub.endpoint,
        )  # fmt: skip
        assert [c for c in hub.calls() if "/branch/" in c or "/commit/" in c] == ["POST /api/kernels/me/tiny-kernel/commit/main"]
        assert sorted(set(hub.repos["me/tiny-kernel"].branches["main"]) - {".gitattributes"}) == report["files"]
    assert [c["branch"] for c in result.commits] == ["main"]


def test_create_pr_opens_pull_requests_and_leaves_branches_alone(dry_run: dict) -> None:
    stage, report = dry_run["stage"], dry_run["report"]
    with FakeHub() as hub:
        result = _upload(stage, report, hub, create_pr=True)
        commits = [r for r in hub.requests if "/commit/" in r.path]
        assert [r.query.get("create_pr") for r in commits] == [["1"], ["1"]]
        repo = hub.repos["me/tiny-kernel"]
        assert sorted(repo.branches["main"]) == [".gitattributes"]
        assert [pr["target"] for pr in repo.pull_requests] == ["v1", "main"]
    assert all(c["pr_url"] for c in result.commits)


def test_no_token_is_exit_2_and_says_how_to_finish(dry_run: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants as hf_constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    with FakeHub() as hub:
        with pytest.raises(UsageError) as info:
            _upload(dry_run["stage"], dry_run["report"], hub, token=None)
        assert hub.requests == []
    message = info.value.message
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert "HF_TOKEN" in message and "hf upload me/tiny-kernel" in message and str(dry_run["stage"]) in message
    assert (dry_run["stage"] / "README.md").is_file()


def test_no_network_is_exit_3_and_keeps_the_stage(dry_run: dict) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(HarnessError) as info:
        _upload(dry_run["stage"], dry_run["report"], None, endpoint=f"http://127.0.0.1:{port}")  # type: ignore[arg-type]
    assert info.value.exit_code == ExitCode.KERNEL_CRASHED
    assert "Could not reach the Hub" in info.value.message and "hf upload" in info.value.message
    assert (dry_run["stage"] / "README.md").is_file()


def test_rejected_token_is_exit_2(dry_run: dict) -> None:
    with FakeHub() as hub:
        with pytest.raises(HarnessError) as info:
            _upload(dry_run["stage"], dry_run["report"], hub, token="hf_read_only")
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert "HTTP 401" in info.value.message and "write access" in info.value.message


@pytest.mark.skipif(not BENCHMARK_CPU_EXISTS, reason="scripts/benchmark_cpu.py is not in this checkout yet")
def test_cli_stages_a_built_kernel_dir_and_publishes_through_hf_endpoint(tmp_path: Path) -> None:
    kernel = make_tiny_kernel(tmp_path / "k")
    # the tier guard (issue 24) uploads only tiers with evidence: the stand-in's avx512 unit never runs anywhere
    from kernel_harness.portability import declared_units

    evidence = tmp_path / "evidence.json"
    evidence.write_text(json.dumps({"tier_evidence": [
        {"tier": u.tier, "executed": True, "correct": True, "cpu": "another machine", "emulated": False,
         "source_hash": u.source_hash} for u in declared_units(kernel)]}))
    with FakeHub() as hub:
        proc = run_publish(
            kernel, "--repo-id", "me/tiny-kernel", "--baseline", DATA / "tiny_baseline.py", "--tier-evidence", evidence,
            "--op", "tiny_kernel.rms_norm", "--stage", tmp_path / "st", "--json", tmp_path / "r.json", cwd=tmp_path,
            env={"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": GOOD_TOKEN},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert hub.calls()[0] == "POST /api/repos/create" and hub.calls()[-1].endswith("/commit/main")
        repo = hub.repos["me/tiny-kernel"]
        assert f"build/{variant_name()}/metadata.json" in repo.branches["v1"]
        assert repo.branches["main"]["README.md"] == (tmp_path / "st" / "README.md").read_bytes()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["uploaded"] is True and report["url"].endswith("/kernels/me/tiny-kernel/tree/v1")
    assert report["verification"]["correctness"] == "pass"
    assert "Published" in proc.stdout and report["url"] in proc.stdout


def test_pipeline_refuses_to_upload_when_correctness_could_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernel_harness.publish.verify as verify

    monkeypatch.setattr(verify, "BENCHMARK_SCRIPT", tmp_path / "missing_benchmark_cpu.py")
    output = make_output_dir(tmp_path / "output")
    report: dict = {}
    with FakeHub() as hub:
        with pytest.raises(HarnessError) as info:
            publish(
                PublishOptions(source_dir=output, repo_id="me/tiny-kernel", stage=tmp_path / "st",
                               endpoint=hub.endpoint, token=GOOD_TOKEN, check_args=["--rounds", "3"]),  # fmt: skip
                report,
                log=lambda _line: None,
            )
        assert hub.requests == []
    assert info.value.exit_code == ExitCode.CHECK_FAILED
    assert report["verification"]["correctness"] == "skipped"


# -- the real catalogue kernel -----------------------------------------------


@pytest.mark.slow
def test_catalogue_kernel_dry_run(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    try:
        kernel_dir: Path = request.getfixturevalue("catalogue_kernel_dir")
    except pytest.FixtureLookupError:
        pytest.skip("the catalogue_kernel_dir fixture (tests/fixtures_kernels.py) is not available")
    baseline = PROJECT_ROOT / "examples" / "rms_norm" / "baseline.py"
    # copy (keeping times) so the shared cached build is never modified
    kernel = tmp_path / "harness_catalogue"
    shutil.copytree(kernel_dir, kernel, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    proc = run_publish(
        kernel, "--repo-id", "me/harness-catalogue", "--dry-run", "--no-build", "--baseline", baseline,
        "--op", "harness_catalogue.rms_norm", "--json", tmp_path / "r.json",
        # the templates' kernels round an fp32 result once; benchmark_cpu.py accepts that rule on request
        "--accept-if-as-accurate",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert any(name.endswith(".so") for name in report["files"])
    assert report["verification"]["kernels_benchmark"] == "pass"
    assert report["verification"]["correctness"] == ("pass" if BENCHMARK_CPU_EXISTS else "skipped")
    card = (Path(report["stage_dir"]) / "README.md").read_text()
    assert re.search(r"`rms_norm\(x, weight, eps(=[0-9e.-]+)?, out=None\)", card)
    assert "`add_rms_norm(" in card and "`softmax(" in card  # the whole catalogue's API
    if BENCHMARK_CPU_EXISTS:
        assert re.search(r"\| publish-time check .*\| bfloat16 1024x4096 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \|", card)


# -- the digest check before upload (a copy of the built catalogue kernel, tampered with) -----


def _catalogue_copy(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    try:
        kernel_dir: Path = request.getfixturevalue("catalogue_kernel_dir")
    except pytest.FixtureLookupError:
        pytest.skip("the catalogue_kernel_dir fixture (tests/fixtures_kernels.py) is not available")
    kernel = tmp_path / "harness_catalogue"
    shutil.copytree(kernel_dir, kernel, ignore=shutil.ignore_patterns("dist", "__pycache__", ".objs"))
    (variant,) = [p.parent for p in (kernel / "build").glob("torch*/metadata.json")]
    return kernel, variant


def _flip_last_byte(path: Path) -> str:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    return path.name


TAMPERING = {
    "hash-mismatch": lambda v: _flip_last_byte(next(v.glob("*.abi3.so"))),
    "unknown-file": lambda v: (v / "payload.py").write_text("print('not built here')\n") and "payload.py",
    "missing-file": lambda v: (v / "_ops.py").unlink() or "_ops.py",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_dry_run_refuses_a_variant_changed_after_the_build(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    kernel, variant = _catalogue_copy(request, tmp_path)
    name = TAMPERING[kind](variant)
    proc = run_publish(
        kernel, "--repo-id", "me/harness-catalogue", "--dry-run", "--no-build",
        "--baseline", PROJECT_ROOT / "examples" / "rms_norm" / "baseline.py", "--op", "harness_catalogue.rms_norm",
        "--json", tmp_path / "r.json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert f"build/{variant.name}/{name}: {kind}" in message, message
    assert "Rebuild in" in message and "scripts/build_kernel.py" in message
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 1 and report["uploaded"] is False
    (checked,) = report["integrity"]["variants"]
    assert [(v["kind"], v["path"]) for v in checked["violations"]] == [(kind, name)]
    assert report["verification"] is None  # refused before the stage was ever imported
