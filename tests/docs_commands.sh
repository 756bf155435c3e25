#!/usr/bin/env bash
# Runs every command printed in README.md and docs/*.md against the build.
# The commands are the lines of fenced ```sh and ```console blocks (a line ending
# in \ goes on; `$ ` before a console command is dropped; console lines without
# it are output). A block's first line may be a marker:
#   # docs-test: skip (WHY; which test runs it)   not run here (two machines, a
#                                                 download, minutes of work)
#   # docs-test: synopsis                         a usage line with [OPTIONS] and
#                                                 placeholders: not run
# Every block, marked or not, has each `--option` given to a vkswarm command
# checked against that command's --help (a misspelled flag fails). The unmarked
# blocks of one page run in order as one bash script (set -euo pipefail) in a
# fresh directory, where `vkswarm` and `build/vkswarm` are the build's binary
# and examples/ the source tree's:
# a command that fails fails the test, naming the page and the block's line.
# Usage: tests/docs_commands.sh [BUILD_DIR] [PAGE.md ...]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
shift || true
bin=$build/vkswarm
[ -x "$bin" ] || { echo "docs_commands: no $bin (build first)" >&2; exit 2; }
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=("$src/README.md" "$src"/docs/*.md)
work=$(mktemp -d /tmp/vkswarm-docs.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
ln -s "$bin" "$work/bin/vkswarm"
ln -s "$src/examples" "$work/examples" # as from the source tree's root
# The pages' MPI runs follow the MPI tests' ASan policy (tests/mpi/common.sh):
# Open MPI's dlclose'd plugins leak what LSan cannot attribute, so mpirun (and
# `vkswarm mpirun`, which runs PATH's mpirun) runs its ranks without leak checks;
# memory errors and UB still abort. Every other command keeps the leak check.
real_mpirun=$(command -v mpirun || true)
if [ -n "$real_mpirun" ]; then
    printf '#!/bin/sh\nASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" exec %q "$@"\n' \
        "$real_mpirun" >"$work/bin/mpirun"
    chmod +x "$work/bin/mpirun"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python3 - "$bin" "$work" "${pages[@]}" <<'PY'
import os, re, shlex, subprocess, sys
bin_, work, pages = sys.argv[1], sys.argv[2], sys.argv[3:]
failed = 0
helps = {}

def help_of(cmd):
    if cmd not in helps:
        p = subprocess.run([bin_] + cmd.split() + ["--help"], capture_output=True, text=True)
        helps[cmd] = p.stdout + p.stderr if p.returncode == 0 else None
    return helps[cmd]

def blocks(path):
    """(first line number, kind, marker, command lines) of each sh/console block"""
    out, cur = [], None
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        s = line.rstrip("\n")
        fence = s.strip()
        if cur is None:
            if fence in ("```sh", "```console"):
                cur = [n + 1, fence[3:], None, [], s[: len(s) - len(s.lstrip())]]
            continue
        if fence == "```":
            out.append(cur[:4]); cur = None; continue
        s = s[len(cur[4]):] if s.startswith(cur[4]) else s.lstrip()
        m = re.match(r"#\s*docs-test:\s*(skip|synopsis)\b", s)
        if m and not cur[3] and cur[2] is None:
            cur[2] = m.group(1); continue
        if cur[1] == "console":
            if not s.startswith("$ ") and not (cur[3] and cur[3][-1].endswith("\\")):
                continue
            s = s[2:] if s.startswith("$ ") else s
        cur[3].append(s)
    return out

def commands(lines):
    """the block's commands, continuation lines joined, here-documents left out"""
    cmds, acc, heredoc = [], "", None
    for s in lines:
        if heredoc:
            if s.strip() == heredoc: heredoc = None
            continue
        acc += s[:-1] + " " if s.endswith("\\") else s
        if s.endswith("\\"): continue
        m = re.search(r"<<-?\s*'?\"?(\w+)", acc)
        if m: heredoc = m.group(1)
        cmds.append(acc); acc = ""
    return cmds

def check_flags(page, line, cmd):
    global failed
    text = re.sub(r"(^|\s)#.*$", "", cmd)          # a trailing comment
    text = re.sub(r"[\[\]]", " ", text).replace("|", " | ")
    try: words = shlex.split(text)
    except ValueError: words = text.split()
    for i, w in enumerate(words):
        if not w.endswith("vkswarm") or i + 1 >= len(words): continue
        sub = words[i + 1]
        if not re.fullmatch(r"[a-z]+", sub): continue   # not a command (a path that ends in vkswarm)
        if sub == "mpirun": continue  # mpirun's own options; the vkswarm command after them is checked
        if sub in ("train", "tasks") and i + 2 < len(words) and not words[i + 2].startswith("-"):
            sub += " " + words[i + 2]
        h = help_of(sub)
        if h is None:
            print(f"docs_commands: {page}:{line}: `vkswarm {sub} --help` failed: no such command?"); failed += 1; continue
        for f in words[i + 2:]:
            if f in ("|", ";", "&&", ">", "2>"): break
            f = f.split("=")[0]
            if re.fullmatch(r"--[a-z0-9][a-z0-9-]*", f) and not re.search(re.escape(f) + r"(?![a-z0-9-])", h):
                print(f"docs_commands: {page}:{line}: vkswarm {sub}: {f} is not in its --help"); failed += 1

ran = skipped = 0
for page in pages:
    rel = os.path.relpath(page, os.path.dirname(os.path.dirname(os.path.abspath(__file__))) if "__file__" in globals() else ".")
    script = ["set -euo pipefail"]
    for line, kind, marker, lines in blocks(page):
        for c in commands(lines): check_flags(page, line, c)
        if marker:
            skipped += 1; continue
        ran += 1
        script.append(f"echo 'docs_commands: {os.path.basename(page)}:{line}' >&2")
        script += lines
    if len(script) == 1: continue
    d = os.path.join(work, os.path.basename(page) + ".d")
    os.makedirs(d)
    os.symlink(os.path.dirname(bin_), os.path.join(d, "build"))
    os.symlink(os.path.join(work, "examples"), os.path.join(d, "examples"))
    env = dict(os.environ, PATH=os.path.join(work, "bin") + ":" + os.environ["PATH"])
    p = subprocess.run(["timeout", "600", "bash", "-c", "\n".join(script)], cwd=d, env=env,
                       capture_output=True, text=True)
    if p.returncode:
        where = [l for l in p.stderr.splitlines() if l.startswith("docs_commands: ")]
        print(f"docs_commands: {page}: FAIL (exit {p.returncode}) in the block at "
              f"{where[-1][15:] if where else '?'}; its stderr ends:")
        print("\n".join(p.stderr.splitlines()[-15:]))
        failed += 1
print(f"docs_commands: {ran} blocks run, {skipped} marked skip/synopsis (flags checked), {failed} failures")
sys.exit(1 if failed else 0)
PY
