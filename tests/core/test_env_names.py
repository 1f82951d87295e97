"""spec.env names follow Kubernetes' strict ``IsEnvVarName`` exactly (apimachinery
``pkg/util/validation``: the regex ``envVarNameFmt`` = ``[-._a-zA-Z][-._a-zA-Z0-9]*`` plus
``hasChDirPrefix``: not ``.``, not ``..``, not starting with ``..``).

Where the table comes from: apimachinery's ``validation_test.go`` has no IsEnvVarName table of its
own; ``TestIsConfigMapKey`` there exercises the same ``hasChDirPrefix`` (all its success and
failure cases are below, and each is also a valid / invalid env name). The rest are the strict
cases of kubernetes' ``TestValidateEnv`` (``pkg/apis/core/validation/validation_test.go``, before
it moved to the relaxed rule: "zero-length name", "illegal character", "dot only", "double dots
only", "leading double dots") and the "must not start with a digit" of ``envVarNameFmtErrMsg``.
"""

from __future__ import annotations

import pytest

from backfill.core.spec import INVALID_ENVIRONMENT, Spec, is_env_var_name, parse_spec

# apimachinery TestIsConfigMapKey: successCases, failureCases.
CONFIG_MAP_KEY_VALID = ["a", "good", "good-good", "still.good", "this.is.also.good", ".so.is.this", "THIS_IS_GOOD", "so_is_this_17"]
CONFIG_MAP_KEY_INVALID = [".", "..", "..bad", "b*d", "bad!&bad"]

VALID = CONFIG_MAP_KEY_VALID + ["abc", "ABC", "AbC_123", "a.b.c", "a-b-c", "secret_value", "ENV_VAR_1", "pre_", "a.b", "_", "-", ".a", "a.."]
INVALID = CONFIG_MAP_KEY_INVALID + ["", "a!b", "..abc", "1BAD", "0a", "a b", "a=b", "é", "a\n"]


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name):
    assert is_env_var_name(name)
    spec = parse_spec({"modelRef": "m", "templateRef": "t", "env": {name: "v"}})
    assert isinstance(spec, Spec) and spec.env == ((name, "v"),)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_names_are_blocked(name):
    assert not is_env_var_name(name)
    problem = parse_spec({"modelRef": "m", "templateRef": "t", "env": {name: "v"}})
    assert problem.reason == INVALID_ENVIRONMENT
    assert repr(name) in problem.message
