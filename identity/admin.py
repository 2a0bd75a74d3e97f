from django.contrib import admin

from identity.models import Identity


@admin.register(Identity)
class IdentityAdmin(admin.ModelAdmin):
    """Where a person's sign-ins come from; an operator links a local account to single sign-on
    by giving it the provider's subject here."""

    list_display = ["user", "source", "site_name", "subject", "updated_at"]
    list_filter = ["source"]
    search_fields = ["user__username", "site_name", "subject"]
    autocomplete_fields = ["user"]
    readonly_fields = ["groups", "updated_at"]
