"""Plugins: loading a user's own algorithms, models, datasets and partition schemes (`loader.plugins`), and refusing the method API's retired forms with one line (`loader.retired`)."""
