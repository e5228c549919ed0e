// Two real OpenID Providers ("institutions") on loopback for the SSO
// tests: node provider.mjs PORT_A DOMAIN_A PORT_B DOMAIN_B REDIRECT_URI.
// Any login name is accepted (oidc-provider's development interactions);
// an account named like an e-mail address has that address, others get
// NAME@DOMAIN. Each start signs with a new RSA key, so a restart is a key
// rotation. Prints "ready" once both listen.
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import Provider from 'oidc-provider';

const [portA, domainA, portB, domainB, redirect] = process.argv.slice(2);

function signingKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), use: 'sig', alg: 'RS256' };
}

// The first institution also offers the device authorization grant
// (`kumo login --device`); the second does not.
function start(port, domain, device) {
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    jwks: { keys: [signingKey()] },
    clients: [{
      client_id: 'kumo',
      client_secret: 'kumo-test-secret',
      redirect_uris: [redirect],
      post_logout_redirect_uris: [redirect.replace('/auth/callback', '/login')],
      grant_types: device
        ? ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code']
        : ['authorization_code'],
      response_types: ['code'],
    }],
    pkce: { required: () => true },
    scopes: ['openid', 'email', 'profile'],
    claims: {
      openid: ['sub', 'eppn', 'affiliation'],
      email: ['email', 'email_verified'],
      profile: ['name'],
    },
    cookies: { keys: ['kumo-test-cookie-key'] },
    features: { devInteractions: { enabled: true }, deviceFlow: { enabled: device } },
    async findAccount(_ctx, id) {
      // `login#Shown Name` gives the account that display name.
      const [login, shown] = id.split('#');
      const email = login.includes('@') ? login : `${login}@${domain}`;
      return {
        accountId: id,
        async claims() {
          return {
            sub: id,
            email,
            email_verified: true,
            name: shown ?? `Test ${login}`,
            eppn: email,
            affiliation: `member@${domain}`,
          };
        },
      };
    },
  });
  provider.proxy = false;
  return new Promise((resolve) => {
    provider.listen(Number(port), '127.0.0.1', resolve);
  });
}

await start(portA, domainA, true);
await start(portB, domainB, false);
console.log('ready');
