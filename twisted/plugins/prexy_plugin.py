"""twistd plugin: makes ``twistd prexy`` start the Prexy service."""

from twisted.application.service import ServiceMaker

prexy = ServiceMaker(
    "Prexy",
    "prexy.service",
    "A streaming, rewriting reverse proxy.",
    "prexy",
)
