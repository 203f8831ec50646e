"""Rooftop Grafana dashboards as code; ``python dashboards/build.py`` renders them."""
