"""The operator API: PolicyService server (server), bearer-token/mTLS auth (auth), persistent state
on SQLite (store) and the CLI commands that call it (client)."""
