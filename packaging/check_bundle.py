"""Check a PyInstaller one-folder bundle's shared-library closure and find its host dependencies.

    python3 packaging/check_bundle.py dist/attnscope [--json OUT]

Every ELF file in the bundle is read with ``readelf -d``; each library it needs (DT_NEEDED) must
be in the bundle or on this (the build) machine. Libraries taken from the host are mapped to
their Debian packages with ``dpkg -S``: those become the .deb's Depends, except libraries needed
only by optional Qt plugins (Wayland, EGL/GLX integrations, input contexts, image formats,
platform themes), whose packages become Recommends: the app starts without them.

Exit status 0 when every needed library resolves; 1 (listing what is missing) otherwise.
Prints a JSON object: {"depends": [...], "recommends": [...], "missing": {lib: [needed by]},
"host_libs": {lib: package}, "elf_files": n}. Standard library only (runs with any python3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# The C library and the loader are always there; libc6 is listed in Depends regardless.
ALWAYS_THERE = re.compile(
    r"^(ld-linux.*|linux-vdso.*|libc\.so.*|libm\.so.*|libdl\.so.*|libpthread\.so.*|librt\.so.*"
    r"|libutil\.so.*|libresolv\.so.*|libmvec\.so.*)$"
)
# Bundle files whose host libraries are optional (the app runs without these plugins).
OPTIONAL_USER = re.compile(
    r"/plugins/(wayland-[^/]+|xcbglintegrations|platforminputcontexts|imageformats|"
    r"platformthemes|iconengines)/|/plugins/platforms/libqwayland|libQt6(WaylandClient|WlShellIntegration)"
)


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def host_library_paths() -> dict[str, str]:
    """``{soname: path}`` from the dynamic linker's cache (x86-64 entries preferred)."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    paths: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
        if m and (m.group(1) not in paths or "x86-64" in m.group(2)):
            paths[m.group(1)] = m.group(3)
    return paths


def debian_package(path: str) -> str | None:
    for candidate in (path, os.path.realpath(path)):
        r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout:
            return r.stdout.split(":")[0].strip()
    return None


def check(bundle: Path) -> dict:
    files = [p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)]
    in_bundle = {p.name for p in bundle.rglob("*") if p.is_file() or p.is_symlink()}
    users: dict[str, list[str]] = {}
    for f in files:
        for lib in needed(f):
            users.setdefault(lib, []).append(str(f.relative_to(bundle)))
    host = host_library_paths()
    depends, recommends, missing, host_libs = set(), set(), {}, {}
    for lib, who in sorted(users.items()):
        if lib in in_bundle or ALWAYS_THERE.match(lib):
            continue
        optional = all(OPTIONAL_USER.search("/" + w) for w in who)
        pkg = debian_package(host[lib]) if lib in host else None
        if pkg is None:
            if not optional:
                missing[lib] = who[:5]
            continue
        host_libs[lib] = pkg
        (recommends if optional else depends).add(pkg)
    recommends -= depends
    return {
        "depends": sorted(depends | {"libc6"}),
        "recommends": sorted(recommends),
        "missing": missing,
        "host_libs": host_libs,
        "elf_files": len(files),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    if not args.bundle.is_dir():
        print(f"check_bundle: no such folder {args.bundle}", file=sys.stderr)
        return 2
    result = check(args.bundle)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    if result["missing"]:
        print(
            f"check_bundle: {len(result['missing'])} needed librar(ies) neither bundled nor on this machine: "
            f"{', '.join(result['missing'])}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
