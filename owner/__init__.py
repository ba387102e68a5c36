"""The owner: the in-Pod runtime that keeps one model revision resident on one card.

It serves the owner control API (HTTP/JSON, bearer token), loads the bundle volume's
``current`` revision with a backend, and carries out transitions: in place (B2) when only
rows of projection / LM-head tensors change, otherwise reload (B1). See docs/owner.md.
"""
