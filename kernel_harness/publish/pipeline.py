"""The publish pipeline: plan, stage, verify, render the card, upload.

``scripts/publish.py`` only parses flags and prints; this module does the
work in the order that makes a bad upload impossible: every file is staged
first, the staged copy is what gets verified, and the upload sends exactly the
verified files.  ``report`` is filled in as the steps run so that a failure
still leaves a complete ``--json`` record of what happened.
"""

from __future__ import annotations

from typing import Any

from ..atomic import exclusive_lock
from ..errors import CheckFailed
from .benchmark_file import render_benchmark_file, workloads_from_description
from .card import CardFacts, machine_text, measurements_from, render_card
from .integrity import Integrity, check_stage_integrity, refuse_unless_intact
from .layout import kernel_functions
from .plan import Log, Plan, PublishOptions, plan_publish
from .staging import list_stage_files, prepare_stage_dir, stage_kernel, write_stage_file
from .tier_guard import apply_drop_unverified_tiers, enforce_tier_evidence, with_all_tiers
from .upload import upload_stage
from .verify import Verification, check_correctness, check_kernels_benchmark, check_loads, describe_baseline

__all__ = ["PublishOptions", "publish"]


def stage_repository(plan: Plan, options: PublishOptions, report: dict[str, Any], log: Log) -> dict[str, Any]:
    """Lay out the repository (everything but the card); returns the baseline's description."""
    log(f"Staging {plan.source.root} -> {plan.stage}")
    prepare_stage_dir(plan.stage)
    report["notes"] += stage_kernel(plan.source, plan.stage, plan.version)
    baseline_info = describe_baseline(plan.baseline)
    workloads = workloads_from_description(baseline_info["workloads"])
    reference_kind = "the baseline's run_baseline" if baseline_info["has_run_baseline"] else "the baseline's reference"
    write_stage_file(
        plan.stage,
        "benchmarks/benchmark.py",
        render_benchmark_file(
            repo_id=options.repo_id,
            version=plan.version,
            function=plan.function,
            workloads=workloads,
            baseline_source=plan.baseline.read_text(encoding="utf-8"),
            reference_kind=reference_kind,
        ),
    )
    baseline_info["headline"] = workloads[0].description
    return baseline_info


def verify_integrity(plan: Plan, report: dict[str, Any], log: Log) -> Integrity:
    """Re-hash each staged variant against its build-time digest (kernels-data); refuse on any difference."""
    log("Digest check: re-hashing the staged build variants with kernels-data")
    integrity = check_stage_integrity(plan.stage, [v.name for v in plan.source.variants])
    report["integrity"] = integrity.as_dict()
    refuse_unless_intact(integrity, plan.stage, plan.source.root)
    if any(v.signed for v in integrity.variants):
        report["notes"].append(
            "a variant carries metadata.json.sigstore; this harness never makes one and did not verify it "
            "(it is uploaded as found; check it with kernels.verify.verify_variant)"
        )
    return integrity


def verify_stage(plan: Plan, report: dict[str, Any], log: Log) -> Verification:
    """The three fresh-process checks; raises on the first failure (see verify.py)."""
    verification = Verification()
    op_path = f"{plan.source.name}.{plan.function}"
    try:
        log("Check 1/3: loading the stage with kernels.get_local_kernel in a fresh process")
        verification.load = check_loads(plan.stage)
        defined = {f.name for f in kernel_functions(plan.source)}
        missing = sorted(defined - set(verification.load.get("functions", [])))
        if missing:
            raise CheckFailed(
                f"The staged kernel loads, but its module lacks {', '.join(missing)}, which its Python sources "
                "define. The build is out of date with the sources; rebuild and rerun."
            )
        tiers = verification.load.get("available_tiers")
        verification.lines.append(
            "Loads with `kernels.get_local_kernel` in a fresh process"
            + (f" (tiers available on the publishing machine: {', '.join(tiers)})." if tiers else ".")
        )
        log(f"Check 2/3: scripts/benchmark_cpu.py correctness of {op_path} on the stage")
        check_args = with_all_tiers(plan.check_args, verification.load)  # issue 24: every tier runnable here
        check_correctness(plan.stage, plan.baseline, op_path, verification, check_args)
        if verification.benchmark and verification.benchmark.get("delegation"):
            report["notes"].append(
                "scripts/benchmark_cpu.py reports that the kernel call runs the baseline's own ATen ops "
                "(delegation); the published kernel is not a kernel of its own."
            )
        log("Check 3/3: benchmarks/benchmark.py through the runner of `kernels benchmark`")
        check_kernels_benchmark(plan.stage, verification)
    finally:
        report["verification"] = verification.as_dict()
    return verification


def write_card(plan: Plan, options: PublishOptions, baseline_info: dict[str, Any], verification: Verification,
               report: dict[str, Any], integrity: Integrity | None = None) -> None:  # fmt: skip
    """Render README.md into the stage from what was measured and verified."""
    source = plan.source
    compat_dir = all((plan.stage / "build" / v.name / source.name / "__init__.py").is_file() for v in source.variants)
    if not compat_dir:
        report["notes"].append(
            f"build/<variant>/{source.name}/ is missing: kernels' requirements ask for it so older kernels "
            "releases can load the build (the card says so); current releases do not need it."
        )
    headline = baseline_info["headline"]
    facts = CardFacts(
        repo_id=options.repo_id,
        version=plan.version,
        variants=[v.name for v in source.variants],
        dtypes=baseline_info["dtypes"],
        headline=headline,
        measurements=measurements_from(source.summary, verification.benchmark, headline),
        machine=machine_text((verification.benchmark or {}).get("machine")),
        verification=([integrity.summary_line()] if integrity else []) + verification.lines,
        description=options.description or "",
        baseline_doc=baseline_info.get("doc", ""),
        function=plan.function,
        headline_args=baseline_info.get("headline_args", []),
        compat_dir=compat_dir,
        digest_algorithm=integrity.algorithm if integrity else None,
        signed=integrity.signed if integrity else False,
    )
    card = render_card(source, facts)
    write_stage_file(plan.stage, "README.md", card)
    report.update(files=list_stage_files(plan.stage), card_path=str(plan.stage / "README.md"), card=card)


def publish(options: PublishOptions, report: dict[str, Any], log: Log = print) -> dict[str, Any]:
    """Run the pipeline; ``report`` is updated in place (and returned) for ``--json``."""
    options = apply_drop_unverified_tiers(options, report, log)  # issue 24: tier_guard.py
    plan = plan_publish(options, report, log)
    # Two publishers sharing a stage would verify one's files and upload the other's.
    with exclusive_lock(plan.stage.parent / f".{plan.stage.name}.lock"):
        baseline_info = stage_repository(plan, options, report, log)
        integrity = verify_integrity(plan, report, log)
        verification = verify_stage(plan, report, log)
        write_card(plan, options, baseline_info, verification, report, integrity)
        enforce_tier_evidence(plan, options, verification, report)  # issue 24: tier_guard.py
        if options.dry_run:
            report["uploaded"] = False
            return report
        if verification.correctness != "pass":
            raise CheckFailed(
                "The correctness check did not run (scripts/benchmark_cpu.py is missing), and publish.py never "
                f"uploads an unchecked kernel. The stage is at {plan.stage}; restore the script and rerun."
            )
        files = report["files"]
        log(f"Uploading {len(files)} files to {options.repo_id} (branch {plan.branch}, card on main)")
        result = upload_stage(
            plan.stage,
            files,
            repo_id=options.repo_id,
            branch=plan.branch,
            variants=[v.name for v in plan.source.variants],
            version=plan.version,
            create_pr=options.create_pr,
            private=options.private,
            token=options.token,
            endpoint=options.endpoint,
        )
    report.update(uploaded=True, upload=result.as_dict(), url=f"{result.repo_url.rstrip('/')}/tree/{plan.branch}")
    return report
