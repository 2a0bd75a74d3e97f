"""Who a person is: single sign-on (OpenID Connect), the site's directory (LDAP), the names
they have on clusters, and the short-lived SSH certificates the platform signs for them."""
