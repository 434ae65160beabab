"""Prexy's cache: policy (what may be stored, for how long) and the shared store.

(Evaluation notes follow once measured.)
"""

from prexy.cache.policy import (
    Action,
    CachePolicy,
    RequestDecision,
    StoreAction,
    StoreDecision,
    accept_encoding_bucket,
    age_header,
    cache_key,
    cache_status_header,
    key_url,
    not_modified,
    primary_key,
    request_decision,
    response_decision,
    vary_key,
    vary_names,
)
from prexy.cache.store import CachedObject, LookupResult, ObjectMeta, Store, Writer

__all__ = [
    "Action",
    "CachePolicy",
    "CachedObject",
    "LookupResult",
    "ObjectMeta",
    "RequestDecision",
    "Store",
    "StoreAction",
    "StoreDecision",
    "Writer",
    "accept_encoding_bucket",
    "age_header",
    "cache_key",
    "cache_status_header",
    "key_url",
    "not_modified",
    "primary_key",
    "request_decision",
    "response_decision",
    "vary_key",
    "vary_names",
]
