"""The browser UI: server-rendered pages over the services layer, made live with htmx."""
