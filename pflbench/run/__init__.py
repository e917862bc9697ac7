"""The run machinery: a spec expanded into cells, the cells scheduled (in process or on Ray), stopped and recovered (SIGTERM, lost workers, OOM kills, full disks), and what a person sees of it."""
