#!/bin/sh
# As the official image: `redis-server ARGS` without a config file gets --protected-mode no.
if [ "$1" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
fi
exec "$@"
