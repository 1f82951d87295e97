#!/usr/bin/env bash
# Tools the ship tests use, installed when missing (idempotent; quick when already installed):
#   promtool   - `promtool test rules` on deploy/monitoring (Debian/Ubuntu package "prometheus")
#   kustomize  - renders every kustomization in deploy/ (go install, pinned version)
# Fails loudly (non-zero exit) when an install fails: CI must not silently skip these tests.
set -euo pipefail

KUSTOMIZE_VERSION=v5.7.1

if ! command -v promtool >/dev/null 2>&1; then
  echo "install_tools: installing promtool (apt package prometheus)" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null 2>&1 || { echo "install_tools: promtool still not on PATH" >&2; exit 1; }
fi

gobin="$(go env GOBIN)"
if [ -z "$gobin" ]; then gobin="$(go env GOPATH)/bin"; fi
if ! { [ -x "$gobin/kustomize" ] && "$gobin/kustomize" version 2>/dev/null | grep -qx "$KUSTOMIZE_VERSION"; }; then
  echo "install_tools: installing kustomize $KUSTOMIZE_VERSION into $gobin" >&2
  go install "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
fi
echo "install_tools: $(promtool --version 2>&1 | head -n1); kustomize $("$gobin/kustomize" version)" >&2
