// The tests' OpenID provider: oidc-provider (OpenID Certified) with our own login page, test
// users from a JSON config, consent granted for our first-party clients, the device flow,
// RP-initiated logout and revocation.
//
// Usage: node scripts/idp/provider.mjs CONFIG.json
// CONFIG: {"port", "issuer", "clients": [client metadata...], "users": [{"login", "password",
// "claims": {"sub", ...}}], "jwks": {"keys": [private JWK...]} (optional: an RS256 key is made)}
// Prints "READY <issuer>" on stdout once it listens. See scripts/README.md.
import { generateKeyPairSync, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const users = config.users ?? [];

function signingKeys() {
  if (config.jwks) return config.jwks;
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { keys: [{ ...jwk, alg: 'RS256', use: 'sig', kid: randomBytes(8).toString('hex') }] };
}

function escape(text) {
  return String(text ?? '').replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title></head>
<body><main><h1>${escape(title)}</h1>
${body}
</main></body></html>`;
}

function sameText(a, b) {
  const left = Buffer.from(String(a));
  const right = Buffer.from(String(b));
  return left.length === right.length && timingSafeEqual(left, right);
}

function checkPassword(login, password) {
  return users.find((user) => sameText(user.login, login) && sameText(user.password, password));
}

function loginPage(uid, { login = '', error = '' } = {}) {
  const wrong = error ? `<p class="error" role="alert">${escape(error)}</p>\n` : '';
  return page('Sign in', `${wrong}<form method="post" action="/interaction/${escape(uid)}/login">
<label>Login <input type="text" name="login" value="${escape(login)}" autocomplete="username" autofocus required></label>
<label>Password <input type="password" name="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form>`);
}

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: signingKeys(),
  // Random per run: sessions do not outlive the process, which is what tests want.
  cookies: { keys: [randomBytes(32).toString('hex')] },
  findAccount(ctx, sub) {
    const user = users.find((candidate) => candidate.claims.sub === sub);
    if (!user) return undefined;
    return { accountId: sub, claims: () => ({ ...user.claims }) };
  },
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username', 'groups'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
  // Relying parties read the person from the ID token alone (no userinfo call needed).
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  // The CLI's device grant gets a refresh token without asking for offline_access.
  issueRefreshToken: (ctx, client) => client.grantTypeAllowed('refresh_token'),
  features: {
    devInteractions: { enabled: false },
    deviceFlow: {
      enabled: true,
      userCodeInputSource(ctx, form, out, err) {
        const error = err ? '<p class="error" role="alert">That code is not valid</p>\n' : '';
        ctx.body = page('Enter the code', `${error}${form}\n<button type="submit" form="op.deviceInputForm">Continue</button>`);
      },
      userCodeConfirmSource(ctx, form, client, deviceInfo, userCode) {
        ctx.body = page('Confirm the device', `<p>${escape(client.clientName || client.clientId)} shows the code <code>${escape(userCode)}</code>.</p>
${form}
<button type="submit" form="op.deviceConfirmForm">Confirm</button>`);
      },
      successSource(ctx) {
        ctx.body = page('Device signed in', '<p>You can close this page.</p>');
      },
    },
    rpInitiatedLogout: {
      enabled: true,
      logoutSource(ctx, form) {
        ctx.body = page('Sign out', `${form}
<button type="submit" form="op.logoutForm" name="logout" value="yes">Yes, sign me out</button>`);
      },
      postLogoutSuccessSource(ctx) {
        ctx.body = page('Signed out', '<p>You are signed out.</p>');
      },
    },
    revocation: { enabled: true },
    introspection: { enabled: true },
  },
  renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = page('Error', `<p class="error">${escape(out.error)}: ${escape(out.error_description)}</p>`);
  },
});

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

function sendHtml(res, status, html) {
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
  res.end(html);
}

// Our clients are first-party: what they ask for is granted without a consent page.
async function grantConsent(details) {
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
  const { missingOIDCScope, missingOIDCClaims, missingResourceScopes } = details.prompt.details;
  if (missingOIDCScope) grant.addOIDCScope(missingOIDCScope.join(' '));
  if (missingOIDCClaims) grant.addOIDCClaims(missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  return { consent: { grantId: await grant.save() } };
}

async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) return sendHtml(res, 400, page('Error', '<p>Unknown sign-in request</p>'));
  if (details.prompt.name === 'consent') {
    return provider.interactionFinished(req, res, await grantConsent(details), { mergeWithLastSubmission: true });
  }
  if (req.method === 'GET') {
    return sendHtml(res, 200, loginPage(uid, { login: details.params.login_hint }));
  }
  if (req.method === 'POST' && action === 'login') {
    const form = await readForm(req);
    const user = checkPassword(form.get('login') ?? '', form.get('password') ?? '');
    if (!user) {
      return sendHtml(res, 200, loginPage(uid, { login: form.get('login'), error: 'Wrong login or password' }));
    }
    return provider.interactionFinished(req, res, { login: { accountId: user.claims.sub } }, { mergeWithLastSubmission: false });
  }
  return sendHtml(res, 405, page('Error', '<p>Method not allowed</p>'));
}

const callback = provider.callback();
const server = createServer((req, res) => {
  const match = /^\/interaction\/([^/?]+)(?:\/(login))?(?:\?.*)?$/.exec(req.url);
  if (!match) return callback(req, res);
  interaction(req, res, match[1], match[2]).catch((error) => {
    // An expired or foreign interaction cookie: the person starts over at the client.
    sendHtml(res, error.statusCode ?? 500, page('Error', `<p class="error">${escape(error.message)}</p>`));
  });
});

server.listen(config.port, '127.0.0.1', () => {
  process.stderr.write(`jwks_uri ${config.issuer}/jwks\n`);
  process.stdout.write(`READY ${config.issuer}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => server.close(() => process.exit(0)));
