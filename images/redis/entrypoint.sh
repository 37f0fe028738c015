#!/bin/sh
# farm-redis refuses to start without a password: whoever can write to the broker can run code
# in every sandbox. The password comes from the environment (docker-compose.yml's env file, made
# by scripts/compose-secret) and reaches redis-server as configuration on its standard input
# (`redis-server -`), never on a command line, where `ps` would show it to every local user.
set -eu
if [ -z "${FARM_BROKER_PASSWORD:-}" ]; then
    echo "farm-redis: FARM_BROKER_PASSWORD is not set; refusing to serve an open broker" >&2
    exit 1
fi
case "$FARM_BROKER_PASSWORD" in
    *'"'* | *'\'*)
        echo 'farm-redis: FARM_BROKER_PASSWORD may not hold " or \' >&2
        exit 1
        ;;
esac
exec redis-server - "$@" <<CONFIG
requirepass "$FARM_BROKER_PASSWORD"
CONFIG
