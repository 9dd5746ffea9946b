#!/usr/bin/env bash
# Install the Debian packages the tools use (numactl for pinned benchmarks,
# ccache for incremental builds, linux-perf for the profiler, qemu-user for
# scripts/check_portability.py's emulated CPUs) when running as root and they
# are missing; otherwise say what was skipped. Never fatal: every tool degrades
# with a clear message when its package is absent (the QEMU tests skip).
set -u
declare -A wanted=([numactl]=numactl [ccache]=ccache [perf]=linux-perf [qemu-x86_64]=qemu-user)
missing=()
for tool in "${!wanted[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${wanted[$tool]}")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "system packages: numactl, ccache, perf and qemu-x86_64 are present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system packages: skipped installing ${missing[*]} (needs root and apt-get); the tools that use them report their absence"
    exit 0
fi
echo "system packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/tmp/kernel-harness-apt.log 2>&1; then
    echo "system packages: apt-get failed (log: /tmp/kernel-harness-apt.log); continuing without ${missing[*]}"
fi
exit 0
