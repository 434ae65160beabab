"""Tests of prexy.nginxconf: the nginx configuration reader and prexy convert nginx."""
