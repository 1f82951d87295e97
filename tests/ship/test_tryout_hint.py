"""The controller's hint for a custom resource kind that is not installed names the README's own
try-out commands (it said `kubectl apply -f tests/envtest/crds/ -f deploy/crds/`, which exits 1:
kubectl also reads deploy/crds/kustomization.yaml as a manifest)."""

from __future__ import annotations

from pathlib import Path

from backfill.controller.watchers import TRYOUT_CRDS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_missing_crd_hint_is_the_readmes_tryout():
    text = README.read_text()
    block = text.split("<!-- try-out -->", 1)[1].split("```", 2)[1]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    for command in TRYOUT_CRDS.split(" && "):
        assert command in lines, (command, lines)
