"""The state exchange between islands over ZeroMQ: messages, payloads, server, client.

`wire` knows messages and bytes, `payload` packs and checks tensors, `server` (ROUTER) serves an
island's snapshot and `client` (DEALER) fetches one, `flowcontrol` sizes chunks and windows to the
link, `linkemu` paces what a process sends (WAN emulation and the upload cap), `sockets` holds the
ZeroMQ set-up both sides share (context, keys from the swarm secret, the ZAP check).
`docs/PROTOCOL.md` is the specification.
"""
