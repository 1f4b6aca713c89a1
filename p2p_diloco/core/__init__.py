"""The training core: model, data, inner loop, outer loop, the island's state machine, codecs.

No sockets, no discovery, no threads: the simulator drives islands from here on a virtual clock,
the island process (`p2p_diloco.peers`) drives one with a gossip worker. Imports only
`p2p_diloco.config` and `p2p_diloco.errors` from the project.
"""
