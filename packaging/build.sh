#!/usr/bin/env bash
# Build AttnScope's Linux packages from a source checkout:
#   PyInstaller one-folder bundle (dist/attnscope/) -> strip torch's libraries -> library check
#   -> portable dist/attnscope-<version>-linux-<arch>.tar.gz and dist/attnscope_<version>_<arch>.deb
#
# Usage: packaging/build.sh [--skip-pyinstaller] [--no-deb] [--no-tar]
# Environment:
#   PYTHON=/path/to/python        interpreter with the app, its dependencies and pyinstaller
#                                 (default: python3 on PATH; `pip install -e .[package]`)
#   ATTNSCOPE_WITH_MLX=0|1        bundle the MLX backend (default 1, ~40 MB)
#   ATTNSCOPE_DEB_COMPRESSION=zstd|xz|gzip   (default zstd: dpkg >= 1.21.18, Debian 12, Ubuntu 21.10+;
#                                 use xz for older dpkg)
#   ATTNSCOPE_DEB_LEVEL=N         compression level (default 9 for zstd, 6 otherwise)
# Host tools: binutils (strip, readelf), dpkg-deb, tar, gzip (pigz if present), zstd.
# Writes a summary with times (s) and sizes (bytes) to dist/attnscope-build.json.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
SKIP_PYI=0; DO_DEB=1; DO_TAR=1
for arg in "$@"; do
  case "$arg" in
    --skip-pyinstaller) SKIP_PYI=1 ;;
    --no-deb) DO_DEB=0 ;;
    --no-tar) DO_TAR=0 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
for tool in strip readelf tar; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool not found (apt-get install binutils tar)" >&2; exit 1; }
done
if [ "$DO_DEB" = 1 ]; then
  command -v dpkg-deb >/dev/null || { echo "build.sh: dpkg-deb not found" >&2; exit 1; }
fi

VERSION="$("$PYTHON" -c 'import attnscope; print(attnscope.__version__)')"
ARCH_DEB="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
ARCH="$(uname -m)"
BUNDLE="dist/attnscope"
TARBALL="dist/attnscope-${VERSION}-linux-${ARCH}.tar.gz"
DEB="dist/attnscope_${VERSION}_${ARCH_DEB}.deb"
mkdir -p dist build
now() { date +%s.%N; }
since() { "$PYTHON" -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$1" "$(now)"; }
T_START=$(now)

# 1. PyInstaller -----------------------------------------------------------------------------------
T=$(now)
if [ "$SKIP_PYI" = 0 ]; then
  [ -f assets/icons/attnscope.png ] || "$PYTHON" packaging/make_icon.py
  "$PYTHON" -m PyInstaller --version >/dev/null 2>&1 || {
    echo "build.sh: PyInstaller is not installed for $PYTHON (pip install -e '.[package]')" >&2; exit 1; }
  "$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
    packaging/attnscope.spec
fi
[ -x "$BUNDLE/attnscope" ] || { echo "build.sh: $BUNDLE/attnscope missing (PyInstaller failed?)" >&2; exit 1; }
T_PYI=$(since "$T")

# 2. Strip the large unstripped libraries, and only those (PyInstaller's strip=True also strips
#    numpy's bundled OpenBLAS, which then fails to load): torch -90 MB, libpython -17 MB (its
#    debug info), mlx -3 MB, tokenizers -3 MB.
T=$(now)
for lib in torch/lib/libtorch_cpu.so torch/lib/libtorch_python.so torch/lib/libc10.so libpython3*.so.1.0 \
           mlx/lib/libmlx.so tokenizers/tokenizers.abi3.so; do
  for f in "$BUNDLE"/_internal/$lib; do
    if [ -f "$f" ]; then strip --strip-unneeded "$f"; fi
  done
done
T_STRIP=$(since "$T")

# 3. Every needed shared library is bundled or comes from a known Debian package
"$PYTHON" packaging/check_bundle.py "$BUNDLE" --json build/bundle-deps.json >/dev/null
BUNDLE_BYTES=$(du -sb "$BUNDLE" | cut -f1)

# 4. Portable .tar.gz ----------------------------------------------------------------------------
T=$(now)
TAR_BYTES=0
if [ "$DO_TAR" = 1 ]; then
  STAGE="build/tar/attnscope-${VERSION}"
  rm -rf build/tar && mkdir -p "$STAGE"
  cp -a "$BUNDLE"/. "$STAGE"/
  cp assets/icons/attnscope.png assets/attnscope.desktop "$STAGE"/
  cp packaging/linux/README-portable.txt "$STAGE"/README.txt
  GZ=gzip; command -v pigz >/dev/null && GZ=pigz
  tar -C build/tar --owner=0 --group=0 -cf - "attnscope-${VERSION}" | "$GZ" -6 > "$TARBALL"
  TAR_BYTES=$(stat -c %s "$TARBALL")
  rm -rf build/tar  # a second copy of the bundle
fi
T_TAR=$(since "$T")

# 5. .deb ------------------------------------------------------------------------------------------
T=$(now)
DEB_BYTES=0; INSTALLED_KB=0
if [ "$DO_DEB" = 1 ]; then
  STAGE="build/deb/root"
  rm -rf build/deb && mkdir -p "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" "$STAGE/DEBIAN" \
    "$STAGE/usr/share/doc/attnscope"
  cp -a "$BUNDLE" "$STAGE/opt/attnscope"
  ln -s /opt/attnscope/attnscope "$STAGE/usr/bin/attnscope"
  cp assets/attnscope.desktop "$STAGE/usr/share/applications/attnscope.desktop"
  for size in 32 48 64 128 256; do
    d="$STAGE/usr/share/icons/hicolor/${size}x${size}/apps"; mkdir -p "$d"
    "$PYTHON" -c "import sys; from PIL import Image; Image.open(sys.argv[1]).resize((int(sys.argv[3]),)*2, Image.LANCZOS).save(sys.argv[2])" \
      assets/icons/attnscope.png "$d/attnscope.png" "$size"
  done
  printf 'AttnScope %s, packaged from a PyInstaller build.\nLicense: Apache-2.0\n' "$VERSION" \
    > "$STAGE/usr/share/doc/attnscope/copyright"
  for s in postinst postrm; do install -m 0755 "packaging/linux/$s" "$STAGE/DEBIAN/$s"; done
  INSTALLED_KB=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
  # + the default model that postinst converts into /var/opt/attnscope (float32: 4 bytes a parameter)
  MODEL_KB=$("$PYTHON" -c "from attnscope.core.loading import resolve as models; print((models.read_gguf(models.default_gguf_path()).n_params * 4 + (4 << 20)) // 1024)")
  INSTALLED_KB=$((INSTALLED_KB + MODEL_KB))
  DEPENDS=$("$PYTHON" -c "import json; print(', '.join(json.load(open('build/bundle-deps.json'))['depends']))")
  RECOMMENDS=$("$PYTHON" -c "import json; print(', '.join(json.load(open('build/bundle-deps.json'))['recommends']))")
  sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH_DEB/" -e "s/@INSTALLED_KB@/$INSTALLED_KB/" \
      -e "s/@DEPENDS@/$DEPENDS/" -e "s/@RECOMMENDS@/$RECOMMENDS/" packaging/linux/control.in \
      | grep -v '^Recommends: *$' > "$STAGE/DEBIAN/control"
  COMP="${ATTNSCOPE_DEB_COMPRESSION:-zstd}"
  # zstd -9: 326 MB in ~40 s on 2 cores; -15 saves 1% for ten times the time, -3 costs 6%
  LEVEL="${ATTNSCOPE_DEB_LEVEL:-$([ "$COMP" = zstd ] && echo 9 || echo 6)}"
  dpkg-deb --root-owner-group --threads-max="$(nproc)" -Z"$COMP" -z"$LEVEL" --build "$STAGE" "$DEB" >/dev/null
  DEB_BYTES=$(stat -c %s "$DEB")
  cp "$STAGE/DEBIAN/control" build/deb/control && rm -rf "$STAGE"  # keep the control file to read
fi
T_DEB=$(since "$T")

"$PYTHON" - "$@" <<EOF
import json
summary = {
    "version": "$VERSION", "bundle": "$BUNDLE", "tarball": "$TARBALL" if $DO_TAR else None,
    "deb": "$DEB" if $DO_DEB else None,
    "seconds": {"pyinstaller": $T_PYI, "strip": $T_STRIP, "tar": $T_TAR, "deb": $T_DEB,
                "total": round($(now) - $T_START, 1)},
    "bytes": {"bundle": $BUNDLE_BYTES, "tarball": $TAR_BYTES, "deb": $DEB_BYTES,
              "installed": $INSTALLED_KB * 1024},
    "bytes_default_model_converted_at_install": ${MODEL_KB:-0} * 1024,
    "deb_depends": json.load(open("build/bundle-deps.json"))["depends"],
}
json.dump(summary, open("dist/attnscope-build.json", "w"), indent=1)
mb = lambda b: f"{b / 2**20:.0f} MiB"
print(f"bundle   {summary['bundle']}: {mb(summary['bytes']['bundle'])}")
if summary["tarball"]:
    print(f"tarball  {summary['tarball']}: {mb(summary['bytes']['tarball'])}")
if summary["deb"]:
    print(f"deb      {summary['deb']}: {mb(summary['bytes']['deb'])} (installed {mb(summary['bytes']['installed'])})")
print("seconds  " + ", ".join(f"{k} {v}" for k, v in summary["seconds"].items()))
EOF
