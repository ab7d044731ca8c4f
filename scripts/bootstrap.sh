#!/usr/bin/env bash
# Installs what pagedlm's build and tests need, and only what is missing.
# Prints one line per step it actually performs; prints nothing when everything is there.
# Idempotent: safe to run before every `npm test` / `npm start`.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "bootstrap: $*"; }
export PATH="$HOME/.cargo/bin:$PATH"

# 1. System packages (Debian): Chromium + its driver for browser tests, Mesa's lavapipe for native Vulkan.
apt_missing=()
for pkg in chromium chromium-driver mesa-vulkan-drivers libvulkan1; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || apt_missing+=("$pkg")
done
if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "apt-get install ${apt_missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
  else
    echo "bootstrap: missing Debian packages: ${apt_missing[*]}; install them as root (apt-get install ${apt_missing[*]})" >&2
    exit 1
  fi
fi

# 2. The wasm target.
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  say "rustup target add wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown >/dev/null 2>&1
fi

# 2b. rustfmt and clippy (npm test checks formatting and lints).
for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    say "rustup component add $component"
    rustup component add "$component" >/dev/null 2>&1
  fi
done

# 3. wasm-pack (its own lockfile works here).
if ! command -v wasm-pack >/dev/null; then
  say "cargo install --locked wasm-pack (a few minutes)"
  cargo install --quiet --locked wasm-pack
fi

# 4. wasm-bindgen-cli at exactly the version in Cargo.lock. Without --locked: the registry here
#    lacks the exact versions of some of its dependencies (see TOOLCHAIN notes in README).
want=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/"/,"",$3); print $3}' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [ -n "$want" ] && [ "$want" != "$have" ]; then
  say "cargo install wasm-bindgen-cli --version $want (a few minutes)"
  cargo install --quiet --force wasm-bindgen-cli --version "$want"
fi

# 5. npm packages.
if [ -f package-lock.json ]; then
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    say "npm ci"
    npm ci --silent --no-audit --no-fund >/dev/null
  fi
fi

# 6. The model.
bash scripts/fetch-model.sh --quiet
