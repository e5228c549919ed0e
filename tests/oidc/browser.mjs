// Drives Debian's Chromium through the portal like a researcher:
// node browser.mjs KUMO_URL INSTITUTION LOGIN TENANT LOCALE OUT_DIR ADMIN_TOKEN
// Chooses the institution, logs in at the provider, lands on the
// dashboard, creates an 8-GPU VM, watches it reach running (live, without
// reloading), looks at its topology, points, a new segment and tokens;
// then an administrator signs in with a token and looks at the hosts. Saves a screenshot of each page in OUT_DIR and prints a JSON
// summary of what it saw.
import { chromium } from 'playwright-core';

const [kumo, institution, login, tenant, locale, out, adminToken] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const page = await browser.newPage({ locale, viewport: { width: 1280, height: 900 } });
const seen = {};
try {
  await page.goto(`${kumo}/`);
  seen.chooser = page.url().includes('/login');
  await page.screenshot({ path: `${out}/login.png`, fullPage: true });
  // The chooser's filter is a script of its own under the pages' CSP:
  // typing the institution's name leaves only it.
  await page.fill('#filter', institution);
  seen.filter_visible = await page.$$eval('#providers li', (lis) => lis.filter((l) => !l.hidden).length);
  await page.fill('#filter', '');
  await page.click(`text=${institution}`);
  // The provider's own pages: sign in, then consent.
  await page.fill('input[name="login"]', login);
  await page.fill('input[name="password"]', 'any');
  await page.click('button[type="submit"]');
  if (await page.$('button[type="submit"]')) {
    await page.click('button[type="submit"]');
  }
  await page.waitForURL(`${kumo}/**`);
  seen.dashboard_lang = await page.getAttribute('html', 'lang');
  seen.dashboard_has_tenant = (await page.$(`tr[data-tenant="${tenant}"]`)) !== null;
  await page.screenshot({ path: `${out}/dashboard.png`, fullPage: true });
  await page.click(`tr[data-tenant="${tenant}"] a`);
  await page.fill('input[name="name"]', 'browser-vm');
  await page.fill('input[name="gpus"]', '8');
  await page.click('form[action$="/vms"] button[type="submit"]');
  await page.waitForURL(`${kumo}/t/${tenant}/vms/browser-vm`);
  // No reload: the page's own script brings the state up to date (the
  // test's host starts VMs only a few seconds after they are created).
  seen.state_at_load = await page.getAttribute('strong.state', 'data-state');
  await page.waitForSelector('strong.state[data-state="running"]', { timeout: 30000 });
  seen.vm_state = await page.getAttribute('strong.state', 'data-state');
  seen.gpu_boxes = (await page.$$('svg.topology g.gpu')).length;
  seen.nic_boxes = (await page.$$('svg.topology g.nic')).length;
  await page.screenshot({ path: `${out}/vm.png`, fullPage: true });
  await page.goto(`${kumo}/t/${tenant}/vms`);
  await page.screenshot({ path: `${out}/vms.png`, fullPage: true });
  await page.goto(`${kumo}/t/${tenant}/billing`);
  seen.billing_bars = (await page.$$('svg.chart rect.bar')).length;
  await page.screenshot({ path: `${out}/billing.png`, fullPage: true });
  await page.click(`nav.tenant a[href="/t/${tenant}/segments"]`);
  await page.fill('input[name="name"]', 'lan');
  await page.fill('input[name="cidr"]', '10.8.0.0/24');
  await page.click('form.create button[type="submit"]');
  await page.waitForURL(`${kumo}/t/${tenant}/segments`);
  seen.segment_listed = (await page.content()).includes('10.8.0.0/24');
  await page.screenshot({ path: `${out}/segments.png`, fullPage: true });
  await page.goto(`${kumo}/tokens`);
  await page.screenshot({ path: `${out}/tokens.png`, fullPage: true });
  // An administrator signs in with an API token, in a browser of their own.
  const admin = await browser.newPage({ locale, viewport: { width: 1280, height: 900 } });
  await admin.goto(`${kumo}/login?next=/admin/hosts`);
  await admin.click('details.token-login summary');
  await admin.fill('input[name="token"]', adminToken);
  await admin.click('details.token-login button[type="submit"]');
  await admin.waitForURL(`${kumo}/admin/hosts`);
  seen.heatmap_gpus = (await admin.$$('svg.heatmap rect.gpu')).length;
  await admin.screenshot({ path: `${out}/admin-hosts.png`, fullPage: true });
  await admin.click('a[href^="/admin/hosts/"]');
  seen.matrix = (await admin.textContent('pre')).includes('GPU0');
  seen.host_vm = (await admin.content()).includes('<td>browser-vm</td>');
  await admin.screenshot({ path: `${out}/admin-host.png`, fullPage: true });
} catch (e) {
  seen.error = String(e);
  await page.screenshot({ path: `${out}/failure.png`, fullPage: true }).catch(() => {});
}
await browser.close();
console.log(JSON.stringify(seen));
