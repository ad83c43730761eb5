"""Fixtures shared by the package's tests."""

import pytest

# Its helpers assert what the ranks reported: pytest's messages for them.
pytest.register_assert_rewrite("rank_processes")

import gradlane  # noqa: E402


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory):
    """Certificates for ranks on loopback (a CA and a certificate naming
    127.0.0.1), made once per test module."""
    d = tmp_path_factory.mktemp("certs")
    gradlane.generate_certs(str(d), ["127.0.0.1"])
    return str(d)
