"""Upload a verified stage to a ``kernel``-type Hub repository with ``huggingface_hub``.

The calls are those ``kernel-builder upload`` makes (its upload.rs), with the
two commits in the opposite order:

1. ``create_repo(repo_type="kernel", exist_ok=True)``;
2. ``list_repo_refs``; ``create_branch("v<version>")`` when it is missing;
3. on an existing version branch, ``list_repo_files`` to find files of the
   staged build variants and benchmarks that the new upload no longer has
   (for example the ``.so`` of the previous build, whose name carries a hash);
4. one commit of the whole stage, plus those deletions, on ``v<version>``;
5. one commit of ``README.md`` and ``LICENSE`` on ``main``, so the card is
   what the repository's page shows.

The build goes first so that ``main`` never advertises a version that failed
to upload.  Every step can be made a pull request instead (``create_pr``)
except the branch creation, which the Hub has no pull request for.

Errors are mapped to the harness exit codes: a missing, invalid or
insufficient token is exit 2 (the user must fix their input); an unreachable
Hub or a server failure is exit 3 (nothing the user typed is wrong; retry or
finish by hand).  Either way the stage stays in place and the message says how
to finish the upload by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import ExitCode, HarnessError, UsageError

REPO_TYPE = "kernel"
MAIN_BRANCH = "main"
#: Files that go to ``main`` as well as to the version branch.
MAIN_FILES = ("README.md", "LICENSE")


class UploadFailed(HarnessError):
    """The Hub could not be reached or refused the upload; the stage is kept."""


@dataclass
class UploadResult:
    repo_url: str
    branch: str
    created_branch: bool
    commits: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "repo_url": self.repo_url,
            "branch": self.branch,
            "created_branch": self.created_branch,
            "commits": self.commits,
            "deleted": self.deleted,
        }


def manual_commands(stage: Path, repo_id: str, branch: str, create_pr: bool = False) -> list[str]:
    """Commands that finish the upload by hand from the kept stage."""
    pr = " --create-pr" if create_pr else ""
    commands = [
        "hf auth login   # or: export HF_TOKEN=hf_...",
        f"hf upload {repo_id} {stage} . --repo-type kernel --revision {branch} "
        f"--exclude .kernel-harness-stage --commit-message 'Upload kernel build ({branch})'{pr}",
    ]
    if branch != MAIN_BRANCH:
        commands.append(
            f"hf upload {repo_id} {stage}/README.md README.md --repo-type kernel --commit-message 'Update card'{pr}"
        )
    return commands


def _manual_hint(stage: Path, repo_id: str, branch: str, create_pr: bool) -> str:
    lines = "\n".join(f"  {c}" for c in manual_commands(stage, repo_id, branch, create_pr))
    return f"The verified stage is kept at {stage}; to finish by hand:\n{lines}"


def resolve_token(explicit: str | None = None) -> str | None:
    """The token ``huggingface_hub`` would use: ``HF_TOKEN`` first, then the saved login."""
    if explicit:
        return explicit
    from huggingface_hub import get_token

    return get_token()


def stale_files(existing: list[str], uploading: list[str], variants: list[str]) -> list[str]:
    """Files on the branch under a staged variant or benchmarks/ that this upload does not replace."""
    keep = set(uploading)
    prefixes = tuple(f"build/{v}/" for v in variants)
    stale = []
    for path in existing:
        if path in keep:
            continue
        name = path.rsplit("/", 1)[-1]
        if path.startswith(prefixes) or (path.startswith("benchmarks/") and name.startswith("benchmark")):
            stale.append(path)
    return sorted(stale)


def upload_stage(
    stage: Path,
    files: list[str],
    *,
    repo_id: str,
    branch: str,
    variants: list[str],
    version: int,
    create_pr: bool = False,
    private: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
) -> UploadResult:
    """Create the repository and branch if needed and commit the stage; see the module doc."""
    token = resolve_token(token)
    if not token:
        raise UsageError(
            "No Hugging Face token: HF_TOKEN is not set and there is no saved login, so nothing was "
            f"uploaded. Create a write token at https://huggingface.co/settings/tokens, then "
            f"`export HF_TOKEN=hf_...` (or run `hf auth login`) and rerun. "
            + _manual_hint(stage, repo_id, branch, create_pr)
        )
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi(endpoint=endpoint, token=token, library_name="kernel-harness", library_version=__version__)
    step = "creating the repository"
    try:
        repo_url = str(api.create_repo(repo_id, repo_type=REPO_TYPE, exist_ok=True, private=private))
        step = "listing the repository's branches"
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
        exists = any(ref.name == branch for ref in refs.branches)
        created = False
        if not exists and branch != MAIN_BRANCH:
            step = f"creating the branch {branch}"
            api.create_branch(repo_id, branch=branch, repo_type=REPO_TYPE, exist_ok=True)
            created = True
        deleted: list[str] = []
        if exists:
            step = f"listing the files on {branch}"
            existing = list(api.list_repo_files(repo_id, revision=branch, repo_type=REPO_TYPE))
            deleted = stale_files(existing, files, variants)
        result = UploadResult(repo_url=repo_url, branch=branch, created_branch=created, deleted=deleted)

        step = f"committing the build to {branch}"
        operations: list[Any] = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(stage / f)) for f in files]
        operations += [CommitOperationDelete(path_in_repo=f) for f in deleted]
        info = api.create_commit(
            repo_id,
            operations=operations,
            commit_message=f"Upload {repo_id.split('/')[-1]} v{version} (kernel-harness publish.py)",
            commit_description="Build variants: " + ", ".join(variants),
            revision=branch,
            repo_type=REPO_TYPE,
            create_pr=create_pr,
        )
        result.commits.append({"branch": branch, "commit_url": info.commit_url, "pr_url": info.pr_url})

        if branch != MAIN_BRANCH:
            step = "committing the card to main"
            card_ops = [
                CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(stage / f)) for f in MAIN_FILES if f in files
            ]
            info = api.create_commit(
                repo_id,
                operations=card_ops,
                commit_message=f"Update card for v{version} (kernel-harness publish.py)",
                revision=MAIN_BRANCH,
                repo_type=REPO_TYPE,
                create_pr=create_pr,
            )
            result.commits.append({"branch": MAIN_BRANCH, "commit_url": info.commit_url, "pr_url": info.pr_url})
        return result
    except OfflineModeIsEnabled as exc:
        raise UploadFailed(
            f"HF_HUB_OFFLINE is set, so huggingface_hub refuses to contact the Hub ({step}). Unset it and rerun. "
            + _manual_hint(stage, repo_id, branch, create_pr),
            exit_code=ExitCode.BAD_INPUT,
        ) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if status in (401, 403):
            raise UploadFailed(
                f"The Hub refused the token while {step} (HTTP {status}: {first_line}). Use a token with write "
                f"access to {repo_id.split('/')[0]} (fine-grained tokens need 'write' on that namespace; kernel "
                "repositories also need kernel-creation access, requested under huggingface.co/settings/account). "
                + _manual_hint(stage, repo_id, branch, create_pr),
                exit_code=ExitCode.BAD_INPUT,
            ) from exc
        if status is not None and 400 <= status < 500:
            raise UploadFailed(
                f"The Hub rejected the upload while {step} (HTTP {status}: {first_line}). Check --repo-id "
                f"{repo_id!r} and --branch {branch!r}. " + _manual_hint(stage, repo_id, branch, create_pr),
                exit_code=ExitCode.BAD_INPUT,
            ) from exc
        raise UploadFailed(
            f"The Hub failed while {step} (HTTP {status}: {first_line}); retry later. "
            + _manual_hint(stage, repo_id, branch, create_pr),
            exit_code=ExitCode.KERNEL_CRASHED,
        ) from exc
    except ValueError as exc:  # invalid repo id, or card metadata the Hub's validator rejects
        raise UploadFailed(
            f"The upload was rejected while {step}: {exc}. " + _manual_hint(stage, repo_id, branch, create_pr),
            exit_code=ExitCode.BAD_INPUT,
        ) from exc
    except OSError as exc:
        raise UploadFailed(
            f"Could not reach the Hub at {api.endpoint} while {step}: {exc}. Check the network connection "
            "(and HF_ENDPOINT if set), then rerun. " + _manual_hint(stage, repo_id, branch, create_pr),
            exit_code=ExitCode.KERNEL_CRASHED,
        ) from exc
    except Exception as exc:  # noqa: BLE001 - httpx2 transport errors are not OSError subclasses
        if _is_transport_error(exc):
            raise UploadFailed(
                f"Could not reach the Hub at {api.endpoint} while {step}: {type(exc).__name__}: {exc}. Check the "
                "network connection (and HF_ENDPOINT if set), then rerun. "
                + _manual_hint(stage, repo_id, branch, create_pr),
                exit_code=ExitCode.KERNEL_CRASHED,
            ) from exc
        raise


def _is_transport_error(exc: BaseException) -> bool:
    try:
        import httpx2
    except ImportError:  # an older huggingface_hub on httpx or requests
        return type(exc).__name__ in {"ConnectError", "ConnectionError", "ConnectTimeout", "ReadTimeout", "TransportError"}
    return isinstance(exc, httpx2.TransportError)
