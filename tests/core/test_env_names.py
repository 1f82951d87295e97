"""spec.env names follow Kubernetes' strict ``IsEnvVarName`` exactly (apimachinery
``pkg/util/validation``: the regex ``[-._a-zA-Z][-._a-zA-Z0-9]*`` plus ``hasChDirPrefix``: not
``.``, not ``..``, not starting with ``..``).

The table is taken from the apiserver's own tests: ``TestValidateEnv`` and ``TestValidateEnvFrom``
(``pkg/apis/core/validation/validation_test.go``: success names and prefixes, and the error cases
"zero-length name", "illegal character", "dot only", "double dots only", "leading double dots"),
the message "must not start with a digit" of ``envVarNameFmtErrMsg``, and the ``hasChDirPrefix``
cases shared with ``TestIsConfigMapKey``.
"""

from __future__ import annotations

import pytest

from backfill.core.spec import INVALID_ENVIRONMENT, Spec, is_env_var_name, parse_spec

VALID = ["abc", "ABC", "AbC_123", "a.b.c", "a-b-c", "secret_value", "ENV_VAR_1", "pre_", "a.b", ".so.is.this", "_", "-", ".a", "a.."]
INVALID = ["", "a!b", ".", "..", "..abc", "..bad", "1BAD", "0a", "b*d", "bad!&bad", "a b", "a=b", "é", "a\n"]


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
