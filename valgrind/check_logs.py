"""Reads valgrind logs (one per process) and fails on any error record whose
stack has a kiln frame: invalid reads/writes, uses of uninitialised values,
invalid frees, and definite leaks. Records without a kiln frame (ORT, glibc,
Python) are counted and shown in a summary but do not fail.

    python3 valgrind/check_logs.py LOG_DIR
"""
import glob
import os
import re
import sys

KILN = re.compile(r"libkiln_ep\.so|kiln_ep::|kiln_ep\b|/src/(ffi|ep|kernels|plan|context|compiler|ir)/")
PREFIX = re.compile(r"^==\d+== ?")


def records(path):
    """Error/leak records: runs of lines between blank ==PID== lines."""
    block = []
    with open(path, errors="replace") as f:
        for line in f:
            text = PREFIX.sub("", line.rstrip("\n"))
            if text.strip() == "":
                if block:
                    yield block
                block = []
            else:
                block.append(text)
    if block:
        yield block


def kind(block):
    head = block[0]
    if "definitely lost" in head:
        return "definite leak"
    if "indirectly lost" in head or "possibly lost" in head or "still reachable" in head:
        return None  # reported, not judged: ORT keeps globals until exit
    for k in ("Invalid read", "Invalid write", "Invalid free", "Mismatched free",
              "Conditional jump", "Use of uninitialised", "Syscall param", "Source and destination overlap"):
        if head.startswith(k):
            return k
    return None


def main(log_dir):
    logs = sorted(glob.glob(os.path.join(log_dir, "*.log")))
    if not logs:
        print(f"valgrind: no logs in {log_dir}")
        return 2
    failures, others, processes = [], {}, 0
    for path in logs:
        text = open(path, errors="replace").read()
        if "Memcheck" not in text:
            continue
        processes += 1
        for block in records(path):
            k = kind(block)
            if k is None:
                continue
            if any(KILN.search(l) for l in block):
                failures.append((path, k, block))
            else:
                others[k] = others.get(k, 0) + 1
    print(f"valgrind: {processes} processes checked, {len(failures)} error(s) in kiln frames")
    if others:
        print("  not in kiln frames (ignored): " + ", ".join(f"{k} x{n}" for k, n in sorted(others.items())))
    for path, k, block in failures[:20]:
        print(f"\n--- {k} ({os.path.basename(path)}) ---")
        print("\n".join(block[:40]))
    return 1 if failures or processes == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
