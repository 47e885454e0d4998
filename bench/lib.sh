# Shell helpers the bench scripts share; each sources it from the repository's root
# (`source bench/lib.sh`).

# wait_port PORT [HINT]: returns once 127.0.0.1:PORT accepts a connection; after two
# minutes says so (with HINT, where to look: a server's log) and ends the script.
wait_port() {
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.2
    done
    echo "port $1 never opened${2:+ (see $2)}" >&2
    exit 1
}

# example_config FEATURES PREDICTIONS GRPC_PORT HTTP_PORT [MODELS]: examples/mesh.toml
# on stdout with the feature store at FEATURES, the prediction log at PREDICTIONS,
# the given ports, and every path absolute (relative paths in a mesh.toml resolve
# against its own directory, and the copy is written elsewhere). MODELS defaults to
# the example models.
example_config() {
    sed -e "s#^models = .*#models = \"${5:-$PWD/examples/models}\"#" \
        -e "s#^views = .*#views = \"$PWD/examples/features/views.toml\"#" \
        -e "s#^path = .*#path = \"$1\"#" -e "s#^dir = .*#dir = \"$2\"#" \
        -e "s#grpc_port = 8001#grpc_port = $3#" -e "s#http_port = 8000#http_port = $4#" examples/mesh.toml
}

# log_off CONFIG: drops the `[prediction_log]` table (up to its blank line) from the
# mesh.toml at CONFIG: a server with the log off.
log_off() {
    sed -i '/^\[prediction_log\]/,/^$/d' "$1"
}

# log_set CONFIG LINE...: adds each LINE (e.g. 'parquet = "deferred"') to the
# `[prediction_log]` table of the mesh.toml at CONFIG; an empty LINE adds nothing.
log_set() {
    local cfg=$1 line
    shift
    for line in "$@"; do
        [ -n "$line" ] && sed -i "/^\[prediction_log\]/a $line" "$cfg"
    done
    return 0
}
