"""The shadow check: a background service that verifies a share of `off` requests after their response
has ended, off their path. Off mode (server/doors/off.py) keeps a reference to what a sampled request
sent and hands it over when it ends; checker.py reads it in its door's wire (`Door.shadow_reader`) and
replays it into detect mode's own machine, answering each Check with detect mode's `verify`
(server/chain/verify.py). Nothing here runs while a client waits.

Owns: checker.py. May import: settings, protocol, observe, state, admission, runtime, chain,
doors.
"""
