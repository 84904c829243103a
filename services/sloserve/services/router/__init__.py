"""The router: the one Controller of several frontends (issue 33, item 2)."""
