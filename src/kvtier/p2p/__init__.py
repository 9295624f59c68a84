"""Peer-to-peer block sharing: instances serve primary-tier blocks to each other (docs/p2p.md)."""
