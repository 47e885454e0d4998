"""Validates rendered Kubernetes manifests against the API's schemas, offline.

Built-in kinds: the JSON schemas shipped in the `kubernetes-validate` package, in
strict mode (unknown fields are errors), for every Kubernetes version given.
Custom resources: the openAPIV3Schema of the CRDs in deploy/schemas/ (checked by
sha256), made strict the same way. A document whose kind has no schema is an
error, never a skip.

    python deploy/validate_manifests.py --kube-version 1.30.0 rendered.yaml ...
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import sys
from pathlib import Path

import jsonschema
import yaml
from kubernetes_validate import utils as kv

SCHEMAS = Path(__file__).resolve().parent / "schemas"
# The CRDs used, and the sha256 of each file as deploy/schemas/README.md records it.
CRDS = {
    "keda.sh_scaledobjects.yaml": "af35555862a83933b074af14ad439c4b4ceabaf4daa3e9338e9b23e36d308d80",
}


def strict(schema):
    """The schema with `additionalProperties: false` on every object that lists
    its properties and does not keep unknown fields."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def load_crds() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> strict schema, for every served version of each CRD."""
    out = {}
    for name, digest in CRDS.items():
        path = SCHEMAS / name
        data = path.read_bytes()
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise SystemExit(f"{path}: sha256 {got}, expected {digest} (see deploy/schemas/README.md)")
        crd = yaml.safe_load(data)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
                out[(f"{group}/{v['name']}", kind)] = strict(schema)
    return out


def where(doc: dict) -> str:
    m = doc.get("metadata", {})
    return f"{doc.get('kind')}/{m.get('name')}"


def validate(doc: dict, versions: list[str], crds: dict) -> list[str]:
    errors = []
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in crds:
        v = jsonschema.Draft7Validator(crds[key])
        for e in sorted(v.iter_errors(doc), key=lambda e: list(e.path)):
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{where(doc)} ({key[0]} CRD schema): {path}: {e.message}")
        return errors
    for version in versions:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{where(doc)} (Kubernetes {e.version}): {path}: {e.message}")
        except kv.SchemaNotFoundError as e:
            errors.append(f"{where(doc)}: {e.message}")
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kube-version", action="append", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    crds = load_crds()
    failed = 0
    for f in args.files:
        docs = [d for d in yaml.safe_load_all(Path(f).read_text()) if d]
        if not docs:
            print(f"   {f}: no documents")
            failed = 1
            continue
        errors = [e for d in docs for e in validate(d, args.kube_version, crds)]
        kinds = sorted({d["kind"] for d in docs})
        for e in errors:
            print(f"   {f}: {e}")
        status = "FAILED" if errors else "ok"
        print(f"   {f}: {len(docs)} documents ({', '.join(kinds)}), "
              f"Kubernetes {', '.join(args.kube_version)}: {status}")
        failed |= bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
