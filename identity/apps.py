from __future__ import annotations

from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_auth_ldap.backend import populate_user

        from identity.sign_in import ldap_user_populated

        # Registered whether or not a directory is set: with none, nothing sends it.
        populate_user.connect(ldap_user_populated, dispatch_uid="identity-ldap-populate-user")
