"""The daemon's HTTP room: server (one port), guard (who may be answered), control (/streams), pages (preview)."""
