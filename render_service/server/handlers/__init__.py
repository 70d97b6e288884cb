"""The endpoints, one module per concern; `server.routes` maps paths to them."""
