#!/usr/bin/env bash
# Makes `import nikki` work from the source tree after a build, like an editable install: writes a
# .pth file pointing at bindings/python into the user's site-packages.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
site="$("$python" -m site --user-site)"
mkdir -p "$site"
echo "$root/bindings/python" > "$site/nikki-dev.pth"
