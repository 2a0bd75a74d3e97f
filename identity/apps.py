from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_delete, post_save

from identity import revocations


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_auth_ldap.backend import populate_user

        from identity.sign_in import ldap_user_populated

        # Registered whether or not a directory is set: with none, nothing sends it.
        populate_user.connect(ldap_user_populated, dispatch_uid="identity-ldap-populate-user")
        # Disabling a user reaches every process that holds connections as them.
        user_model = settings.AUTH_USER_MODEL
        post_save.connect(revocations.user_saved, sender=user_model, dispatch_uid="revocations")
        post_delete.connect(revocations.user_deleted, sender=user_model, dispatch_uid="revoke")
