#!/usr/bin/env bash
# Smoke test of the built .deb: install it, run the installed app headless, remove it.
#
#   packaging/smoke_test.sh [dist/attnscope_<version>_<arch>.deb]     (as root: dpkg -i / dpkg -r)
#
# Steps (each must pass; exit 0 only if all do):
#   1. dpkg -i (its postinst converts the default model into /var/opt/attnscope/default-model)
#   2. files in place: launcher on PATH, .desktop entry (desktop-file-validate if present), icon
#   3. `attnscope --package-selfcheck`: every module a frozen build can miss imports
#   4. start-up to a ready window, twice (the second run has a warm file cache): the time of
#      `attnscope --screenshot X.png` with no prompt = start, load the model, draw, exit
#   5. `attnscope --screenshot X.png --prompt "The cat sat" --steps 2`: exit 0, and the PNG
#      is a real window (not blank: many colours, heatmap cells present)
#   6. `attnscope export ...` (a headless subcommand) writes a PNG
#   7. dpkg -r: /opt/attnscope, /usr/bin/attnscope, /var/opt/attnscope... are gone; dpkg --purge
# The run happens with HOME and the cache in a temporary folder, offscreen (no display needed),
# with no network. Results: $SMOKE_OUT (default build/smoke/) holds the screenshots and
# smoke.json (times in seconds). Needs python3 with Pillow (PYTHON=..., default python3) for
# the PNG check.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DEB="${1:-$(ls -t "$ROOT"/dist/attnscope_*.deb 2>/dev/null | head -n1)}"
OUT="${SMOKE_OUT:-$ROOT/build/smoke}"
[ -f "$DEB" ] || { echo "smoke_test: no .deb given and none in dist/ (run packaging/build.sh)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "smoke_test: must run as root (dpkg -i)" >&2; exit 2; }
if [ "$(dpkg-query -W -f='${Status}' attnscope 2>/dev/null)" = "install ok installed" ]; then
  echo "smoke_test: attnscope is already installed; remove it first (dpkg -r attnscope)" >&2; exit 2
fi
rm -rf "$OUT" && mkdir -p "$OUT"
SANDBOX="$(mktemp -d)"
installed=0
cleanup() {
  if [ "$installed" = 1 ]; then dpkg --purge attnscope >/dev/null 2>&1 || true; fi
  rm -rf "$SANDBOX"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { "$PYTHON" -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$2"; }
fail() { echo "smoke_test: FAIL: $*" >&2; exit 1; }
# The app as a user would start it, in a clean home, offscreen, offline.
run_app() {
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$SANDBOX/home" LANG=C.UTF-8 \
    XDG_CACHE_HOME="$SANDBOX/home/.cache" XDG_CONFIG_HOME="$SANDBOX/home/.config" \
    QT_QPA_PLATFORM=offscreen "$@"
}
mkdir -p "$SANDBOX/home"

echo "== 1. dpkg -i $(basename "$DEB") ($(du -h "$DEB" | cut -f1))"
t0=$(now)
dpkg -i "$DEB" > "$OUT/dpkg-install.log" 2>&1 || { cat "$OUT/dpkg-install.log"; fail "dpkg -i"; }
installed=1
T_INSTALL=$(secs "$t0" "$(now)")
[ -f /var/opt/attnscope/default-model/model.safetensors ] \
  || { cat "$OUT/dpkg-install.log"; fail "postinst did not convert the default model"; }
INSTALLED_KB=$(du -sk /opt/attnscope | cut -f1)
MODEL_KB=$(du -sk /var/opt/attnscope/default-model | cut -f1)

echo "== 2. files"
[ "$(command -v attnscope)" = /usr/bin/attnscope ] || fail "attnscope is not on PATH"
[ -f /usr/share/applications/attnscope.desktop ] || fail "no .desktop entry"
[ -f /usr/share/icons/hicolor/256x256/apps/attnscope.png ] || fail "no icon"
if command -v desktop-file-validate >/dev/null; then
  desktop-file-validate /usr/share/applications/attnscope.desktop || fail ".desktop entry invalid"
fi
run_app attnscope --version | tee "$OUT/version.txt"

echo "== 3. selfcheck"
run_app attnscope --package-selfcheck > "$OUT/selfcheck.txt" 2>&1 || { cat "$OUT/selfcheck.txt"; fail "selfcheck"; }
tail -n1 "$OUT/selfcheck.txt"

echo "== 4. start-up to a ready window (model loaded, window drawn, exit)"
STARTUP=()
for i in 1 2; do
  t0=$(now)
  run_app attnscope --screenshot "$OUT/ready-$i.png" > "$OUT/ready-$i.log" 2>&1 \
    || { cat "$OUT/ready-$i.log"; fail "start-up run $i"; }
  STARTUP+=("$(secs "$t0" "$(now)")")
done
echo "start-up: cold ${STARTUP[0]} s, warm ${STARTUP[1]} s"

echo "== 5. prompt + 2 decode steps, screenshot"
t0=$(now)
run_app attnscope --screenshot "$OUT/prompt.png" --prompt "The cat sat" --steps 2 > "$OUT/prompt.log" 2>&1 \
  || { cat "$OUT/prompt.log"; fail "prompt run"; }
T_PROMPT=$(secs "$t0" "$(now)")
"$PYTHON" - "$OUT/prompt.png" <<'EOF' || fail "screenshot check"
import sys
from PIL import Image
im = Image.open(sys.argv[1]).convert("RGB")
w, h = im.size
colours = im.getcolors(maxcolors=1 << 20)
n = len(colours) if colours else 1 << 20
assert w >= 800 and h >= 500, f"screenshot too small: {w}x{h}"
assert n >= 200, f"screenshot looks blank: {n} distinct colours"
print(f"screenshot {w}x{h}, {n} distinct colours")
EOF
[ ! -d "$SANDBOX/home/.cache/attnscope/converted" ] || fail "the app converted the model again instead of using the pre-converted one"

echo "== 6. headless export"
run_app attnscope export --prompt "The cat sat" --layer 0 --head 0 --out "$OUT/export.png" > "$OUT/export.log" 2>&1 \
  || { cat "$OUT/export.log"; fail "export"; }
[ -s "$OUT/export.png" ] || fail "export wrote nothing"

echo "== 7. dpkg -r, dpkg --purge"
dpkg -r attnscope > "$OUT/dpkg-remove.log" 2>&1 || { cat "$OUT/dpkg-remove.log"; fail "dpkg -r"; }
for p in /opt/attnscope /usr/bin/attnscope /var/opt/attnscope /usr/share/applications/attnscope.desktop \
         /usr/share/icons/hicolor/256x256/apps/attnscope.png; do
  [ ! -e "$p" ] || fail "$p left behind after dpkg -r"
done
# a package with maintainer scripts stays known to dpkg ("config-files") until purged
dpkg --purge attnscope >> "$OUT/dpkg-remove.log" 2>&1 || { cat "$OUT/dpkg-remove.log"; fail "dpkg --purge"; }
installed=0
[ -z "$(dpkg-query -W -f='${Status}' attnscope 2>/dev/null | grep -v not-installed)" ] || fail "still known to dpkg after purge"

cat > "$OUT/smoke.json" <<EOF
{"deb": "$(basename "$DEB")", "deb_bytes": $(stat -c %s "$DEB"), "install_seconds": $T_INSTALL,
 "installed_kib_opt": $INSTALLED_KB, "default_model_kib": $MODEL_KB,
 "startup_seconds_cold": ${STARTUP[0]}, "startup_seconds_warm": ${STARTUP[1]},
 "prompt_run_seconds": $T_PROMPT}
EOF
cat "$OUT/smoke.json"
echo "smoke_test: PASS"
