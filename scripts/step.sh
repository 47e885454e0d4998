# Sourced by the offline check scripts (dashboards/check.sh, deploy/check.sh):
# `step NAME CMD...` runs one check, prints ok or FAILED, and records a failure in
# $failed so that every check runs and the script fails at the end.
failed=0
step() {
    local what=$1
    shift
    echo "== $what"
    if "$@"; then
        echo "   ok"
    else
        echo "   FAILED: $what"
        failed=1
    fi
}
