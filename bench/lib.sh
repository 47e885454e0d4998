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
