"""Configuration put in force: which one applies (forced, pushed by the node agent, fallback),
applying it to the running engine, hooks, controllers and front end, and the config link the
agent pushes over. The configuration document itself (parsing, validation, schemas) is
resmgr/config, which knows nothing of what applies it."""
