//! The human-readable summary table of a run.

use super::scenarios::{
    ArchiveResult, MucLightResult, MucResult, PepResult, PhaseStats, ResumeResult, RoomLayout,
    RoomRampResult, UploadResult,
};
use super::{ConnectResult, RunResult};
use std::fmt::Write as _;

impl RunResult {
    /// The human-readable summary table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let t = &self.target;
        let _ = writeln!(
            s,
            "\n{} {} against {} ({}, domain {}, {} + {}), {} users, {} process(es)",
            self.tool,
            self.scenario,
            if t.label.is_empty() {
                &t.address
            } else {
                &t.label
            },
            t.address,
            t.domain,
            t.tls,
            t.mechanism,
            self.users,
            self.workers
        );
        let c = &self.connect;
        let _ = writeln!(
            s,
            "  sessions   {:>8} established, {} failed of {} in {:.2} s  =>  {:.0} sessions/s",
            c.established, c.failed, c.attempted, c.duration_s, c.sessions_per_s
        );
        let _ = writeln!(
            s,
            "  setup      p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            c.setup_latency.p50_ms,
            c.setup_latency.p90_ms,
            c.setup_latency.p99_ms,
            c.setup_latency.max_ms
        );
        if let (Some(srv), Some(cli)) = (c.server_cpu_s, c.client_cpu_s) {
            let _ = writeln!(
                s,
                "  cpu        server {:.1} s ({:.2} ms/session), load generator {:.1} s",
                srv,
                srv * 1000.0 / c.established.max(1) as f64,
                cli
            );
        }
        if !c.failures.is_empty() {
            let f: Vec<String> = c.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  failures   {}", f.join(" "));
            if let Some(e) = &c.first_error {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
        if let Some(i) = &self.idle {
            let _ = writeln!(
                s,
                "  memory     pid {}: {} KiB -> {} KiB for {} sessions  =>  {:.1} KiB/session",
                i.server_pid, i.rss_before_kb, i.rss_after_kb, i.sessions, i.kb_per_session
            );
            if let (Some(a), Some(f)) = (i.anon_kb_per_session, i.file_kb_per_session) {
                let _ = writeln!(
                    s,
                    "             of which anonymous (heap) {a:.1} KiB/session, file-backed (mapped files, page cache) {f:.1} KiB/session"
                );
            }
        }
        if let Some(o) = &self.o2o {
            let _ = writeln!(
                s,
                "  {:>9} {:>9} {:>11} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8}  ok",
                "target/s",
                "sent/s",
                "delivered/s",
                "arrived/s",
                "ratio",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms"
            );
            for st in &o.steps {
                let _ = writeln!(
                    s,
                    "  {:>9.0} {:>9.0} {:>11.0} {:>9.0} {:>7.4} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>7}  {}",
                    st.target_rate,
                    st.sent_per_s,
                    st.delivered_per_s,
                    st.arrived_per_s,
                    st.delivery_ratio,
                    st.latency.p50_ms,
                    st.latency.p90_ms,
                    st.latency.p99_ms,
                    st.latency.max_ms,
                    pct(st.server_cpu_pct),
                    pct(st.client_cpu_pct),
                    if st.ok { "yes" } else { "NO" }
                );
            }
            let _ = writeln!(
                s,
                "  saturation {:.0} msg/s delivered ({})",
                o.saturation.delivered_per_s, o.saturation.note
            );
        }
        if let Some(a) = &self.archive {
            archive_table(&mut s, a);
        }
        if let Some(m) = &self.sm {
            let _ = writeln!(
                s,
                "  sm         {} <a/> sent, {} <r/> sent, {} <a/> received",
                m.acks_sent, m.requests_sent, m.acks_received
            );
        }
        if let Some(r) = &self.resume {
            resume_table(&mut s, r, c);
        }
        if let Some(m) = &self.muc {
            muc_table(&mut s, m);
        }
        if let Some(m) = &self.muc_light {
            muc_light_table(&mut s, m);
        }
        if let Some(p) = &self.pep {
            pep_table(&mut s, p);
        }
        if let Some(u) = &self.upload {
            upload_table(&mut s, u);
        }
        if let Some(c) = &self.cost {
            let _ = writeln!(
                s,
                "  cost       {:.4} per billion delivered messages at {} per hour",
                c.cost_per_billion, c.hourly_price
            );
        }
        s
    }
}

fn muc_table(s: &mut String, m: &MucResult) {
    let _ = writeln!(
        s,
        "  rooms      {}, history maxstanzas={}",
        layout_line(&m.layout),
        m.history
    );
    let j = &m.join;
    let _ = writeln!(
        s,
        "  joins      {:>8} joined, {} failed of {} in {:.2} s  =>  {:.0} joins/s; {} rooms created (201), {} configured, {} re-sent after item-not-found",
        j.joined, j.failed, j.attempted, j.phase.duration_s, j.joins_per_s, j.created, j.configured, j.retries
    );
    phase_table(
        s,
        "join",
        &j.phase,
        j.joined,
        &format!(
            "presence sent -> subject; {} occupant presences received",
            j.presences_received
        ),
    );
    ramp_table(s, &m.ramp, "occupant");
}

fn muc_light_table(s: &mut String, m: &MucLightResult) {
    let _ = writeln!(
        s,
        "  rooms      MUC Light: {}, run id {:?}",
        layout_line(&m.layout),
        m.run_id
    );
    let c = &m.creation;
    let _ = writeln!(
        s,
        "  creation   {:>8} rooms created, {} failed of {} in {:.2} s  =>  {:.0} rooms/s, {:.0} members/s; {} members, {} re-sent after resource-constraint",
        c.created, c.failed, c.attempted, c.phase.duration_s, c.rooms_per_s, c.members_per_s, c.members, c.retries
    );
    phase_table(
        s,
        "create",
        &c.phase,
        c.created,
        &format!(
            "create iq sent -> result; {}/{} affiliation notifications received",
            c.notifications_received, c.notifications_expected
        ),
    );
    if let Some(r) = &m.memory {
        let _ = writeln!(
            s,
            "  memory     pid {}: {} KiB before, {} KiB logged in, {} KiB with the rooms  =>  {:.1} KiB/session, {:.1} KiB/room",
            r.server_pid, r.rss_before_kb, r.rss_sessions_kb, r.rss_rooms_kb, r.kb_per_session, r.kb_per_room
        );
    }
    ramp_table(s, &m.ramp, "member");
}

/// `N rooms of S at SERVICE (K senders: …)`.
fn layout_line(l: &RoomLayout) -> String {
    format!(
        "{} rooms of {} at {} ({} senders: {})",
        l.rooms,
        l.room_size,
        l.service,
        l.senders,
        if l.senders_per_room == 0 {
            "every member".to_string()
        } else {
            format!("{} per room", l.senders_per_room)
        }
    )
}

/// Latency, CPU and failures of a room setup phase called `what`, whose
/// `done` successes took `note`.
fn phase_table(s: &mut String, what: &str, p: &PhaseStats, done: u64, note: &str) {
    let l = &p.latency;
    let _ = writeln!(
        s,
        "  {what:<10} p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms ({note})",
        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
    );
    if let (Some(srv), Some(cli)) = (p.server_cpu_s, p.client_cpu_s) {
        let _ = writeln!(
            s,
            "  {:<10} server {srv:.1} s ({:.2} ms/{what}), load generator {cli:.1} s",
            format!("{what} cpu"),
            srv * 1000.0 / done.max(1) as f64,
        );
    }
    if !p.failures.is_empty() {
        let f: Vec<String> = p.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  {:<10} {}", format!("{what} fails"), f.join(" "));
        if let Some(e) = &p.first_error {
            let _ = writeln!(s, "  e.g.       {e}");
        }
    }
}

/// The ramp of a group chat scenario; `member` names who gets a copy.
fn ramp_table(s: &mut String, m: &RoomRampResult, member: &str) {
    if !m.errors_by_condition.is_empty() {
        let f: Vec<String> = m
            .errors_by_condition
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(s, "  errors     from the service: {}", f.join(" "));
    }
    if m.steps.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "  copies/s: delivered copies/s; per copy: latency of every {member}'s copy; last: per message, until its LAST {member} got it"
    );
    let _ = writeln!(
        s,
        "  {:>8} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>9} {:>6} {:>6} {:>7}  ok",
        "target/s",
        "sent/s",
        "copies/s",
        "arrived/s",
        "ratio",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "last p50",
        "last p99",
        "server",
        "tool",
        "µs/copy"
    );
    for st in &m.steps {
        let _ = writeln!(
            s,
            "  {:>8.0} {:>8.0} {:>9.0} {:>9.0} {:>7.4} {:>7.1} {:>7.1} {:>7.1} {:>8.1} {:>9.1} {:>9.1} {:>6} {:>6} {:>7}  {}",
            st.target_rate,
            st.sent_per_s,
            st.delivered_per_s,
            st.arrived_per_s,
            st.delivery_ratio,
            st.latency.p50_ms,
            st.latency.p90_ms,
            st.latency.p99_ms,
            st.latency.max_ms,
            st.last_copy_latency.p50_ms,
            st.last_copy_latency.p99_ms,
            pct(st.server_cpu_pct),
            pct(st.client_cpu_pct),
            st.server_cpu_us_per_copy
                .map(|u| format!("{u:.2}"))
                .unwrap_or_else(|| "-".into()),
            if st.ok { "yes" } else { "NO" }
        );
    }
    let errors: u64 = m.steps.iter().map(|s| s.errors).sum();
    let dropped: u64 = m.steps.iter().map(|s| s.client_dropped).sum();
    if errors + dropped + m.unexpected_copies > 0 {
        let _ = writeln!(
            s,
            "  {errors} error stanzas, {dropped} messages the tool could not queue, {} unexpected copies",
            m.unexpected_copies
        );
    }
    let _ = writeln!(
        s,
        "  saturation {:.0} delivered copies/s ({})",
        m.saturation.delivered_per_s, m.saturation.note
    );
}

fn pep_table(s: &mut String, p: &PepResult) {
    let _ = writeln!(
        s,
        "  pep        {} contacts per user ({} groups), {} node(s): {}; caps ver {}",
        p.contacts,
        p.groups,
        p.nodes.len(),
        if p.nodes.is_empty() {
            "none".to_string()
        } else {
            p.nodes.join(", ")
        },
        p.caps_ver
    );
    if let Some(x) = &p.setup {
        let _ = writeln!(
            s,
            "  prepared   {:.1} s (setup over XMPP): {} logins in {:.2} s; {}/{} contacts mutually subscribed ({} already) after {:.2} s, {} subscribe sent, {} pairs reset, {} stale items removed; {}/{} items published after {:.2} s ({} retries), {} stale nodes deleted",
            x.total_s,
            x.logins.established,
            x.logins.duration_s,
            x.contacts_both,
            x.contacts_expected,
            x.contacts_already,
            x.subscribe_s,
            x.subscribes_sent,
            x.pairs_reset,
            x.stale_items_removed,
            x.published,
            x.publish_expected,
            x.publish_s,
            x.publish_retries,
            x.stale_nodes_deleted
        );
        if !x.failures.is_empty() {
            let f: Vec<String> = x.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  prep fails {}", f.join(" "));
            if let Some(e) = &x.first_error {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
    }
    let _ = writeln!(
        s,
        "  storm      {} logins {}, caps {}; a window closes {} ms after the last expected notification, or {:.0} s after the presence; {:.1} s to the last window  =>  {:.0} notifications/s",
        p.logins,
        if p.target_rate > 0.0 {
            format!("at {} logins/s", p.target_rate)
        } else {
            "all at once".to_string()
        },
        if p.caps_warmed_up {
            format!(
                "known to the server (warm-up: {} queries)",
                p.caps_warmup_queries
            )
        } else {
            "new to the server".to_string()
        },
        p.quiet_ms,
        p.window_secs,
        p.duration_s,
        p.notifications_per_s
    );
    let _ = writeln!(
        s,
        "  notified   {:.1} per login ({:.1} expected): {}/{} expected received, {} missing ({} of publishers online first, {} of later ones), {} duplicates, {} unexpected, {} after the window; {}/{} logins complete{}",
        p.received_per_login,
        p.expected_per_login,
        p.received_expected,
        p.expected,
        p.missing,
        p.missing_online_first,
        p.missing_later,
        p.duplicates,
        p.unexpected,
        p.after_window,
        p.complete_logins,
        p.logins,
        if p.closed_in_window > 0 {
            format!(", {} closed by the server", p.closed_in_window)
        } else {
            String::new()
        }
    );
    let (l, a) = (&p.latency, &p.after_presence_latency);
    let _ = writeln!(
        s,
        "  last       p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms (connect -> last notification); from the presence: p50 {:.1} ms  p99 {:.1} ms",
        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms, a.p50_ms, a.p99_ms
    );
    let _ = writeln!(
        s,
        "  traffic    {:.1} KiB received per login after binding ({:.1} presences); {} caps queries answered{}",
        p.bytes_per_login / 1024.0,
        p.presences_per_login,
        p.caps_queries,
        p.server_cpu_ms_per_login
            .map(|c| format!("; server CPU {c:.2} ms/login"))
            .unwrap_or_default()
    );
    if let Some(m) = &p.memory {
        let _ = writeln!(
            s,
            "  memory     pid {}: {} KiB -> {} KiB for {} sessions  =>  {:.1} KiB/session",
            m.server_pid, m.rss_before_kb, m.rss_after_kb, p.logins, m.kb_per_session
        );
    }
    if let Some(f) = &p.fanout {
        let _ = writeln!(
            s,
            "  fan-out    {}/{} publications to {} (one every {} ms, up to {} receivers each, {} errors): {}/{} notifications delivered, {} duplicates, {}/{} publications complete",
            f.sent,
            f.publications,
            f.node,
            f.interval_ms,
            f.max_receivers,
            f.errors,
            f.delivered,
            f.expected,
            f.duplicates,
            f.complete,
            f.sent
        );
        let (l, z) = (&f.latency, &f.last_latency);
        let _ = writeln!(
            s,
            "  fan-out    to each contact p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms; to the last contact p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            l.p50_ms, l.p99_ms, l.max_ms, z.p50_ms, z.p99_ms, z.max_ms
        );
    }
}

fn resume_table(s: &mut String, r: &ResumeResult, login: &ConnectResult) {
    let per = |cpu: Option<f64>, n: u64| cpu.map(|c| c * 1000.0 / n.max(1) as f64);
    let x = &r.resumes;
    let _ = writeln!(
        s,
        "  resumed    {:>8} resumed, {} failed of {} in {:.2} s  =>  {:.0} resumes/s ({:.2}x the login rate)",
        x.established, x.failed, x.attempted, x.duration_s, x.sessions_per_s, r.rate_ratio
    );
    let _ = writeln!(
        s,
        "  resume     p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        x.setup_latency.p50_ms,
        x.setup_latency.p90_ms,
        x.setup_latency.p99_ms,
        x.setup_latency.max_ms
    );
    if let (Some(l), Some(m)) = (
        per(login.server_cpu_s, login.established),
        per(x.server_cpu_s, x.established),
    ) {
        let _ = writeln!(
            s,
            "  cpu        server {l:.2} ms/login, {m:.2} ms/resume ({:.2}x); load generator {:.1} s, {:.1} s",
            r.server_cpu_ratio.unwrap_or(0.0),
            login.client_cpu_s.unwrap_or(0.0),
            x.client_cpu_s.unwrap_or(0.0)
        );
    }
    if !x.failures.is_empty() {
        let f: Vec<String> = x.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  failures   {}", f.join(" "));
        if let Some(e) = &x.first_error {
            let _ = writeln!(s, "  e.g.       {e}");
        }
    }
    let _ = writeln!(
        s,
        "  memory     pid {}: {} KiB before, {} attached, {} with {} unacked each ({} delivered), {} detached",
        r.server_pid,
        r.rss_before_kb,
        r.rss_attached_kb,
        r.rss_filled_kb,
        r.unacked_per_session,
        r.unacked_delivered,
        r.rss_detached_kb
    );
    let _ = writeln!(
        s,
        "             => {:.1} KiB/attached session, {:.1} KiB/detached session ({} detached); h mismatches: {}",
        r.kb_per_attached_session, r.kb_per_detached_session, r.detached, r.h_mismatch
    );
}

fn archive_table(s: &mut String, a: &ArchiveResult) {
    if let Some(f) = &a.fill {
        let _ = writeln!(
            s,
            "  fill       {} of {} messages delivered ({} per user from {} partners) in {:.1} s  =>  {:.0} msg/s{}",
            f.delivered,
            f.sent,
            f.per_user,
            f.partners,
            f.duration_s,
            f.delivered_per_s,
            if f.complete { "" } else { "  INCOMPLETE" }
        );
    }
    let w = &a.warmup;
    let _ = writeln!(
        s,
        "  warm-up    {} message ids collected in {:.1} s; {} user(s) without ids (empty archive or failed warm-up); {} failed queries",
        w.ids, w.duration_s, w.users_without_ids, w.errors
    );
    if let Some(e) = &w.first_error {
        let _ = writeln!(s, "  e.g.       {e}");
    }
    let _ = writeln!(
        s,
        "  {} users, page size {}, {:.0} s, {}",
        a.users,
        a.page_size,
        a.duration_s,
        if a.target_rate > 0.0 {
            format!("target {} queries/s", a.target_rate)
        } else {
            "closed loop".to_string()
        }
    );
    let _ = writeln!(
        s,
        "  {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7}",
        "query",
        "queries",
        "errors",
        "q/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "results",
        "capped"
    );
    for k in &a.kinds {
        let _ = writeln!(
            s,
            "  {:>8} {:>9} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>7}",
            k.kind,
            k.queries,
            k.failed(),
            k.queries_per_s,
            k.latency.p50_ms,
            k.latency.p90_ms,
            k.latency.p99_ms,
            k.latency.max_ms,
            k.results,
            k.capped
        );
    }
    for k in &a.kinds {
        if !k.errors.is_empty() {
            let f: Vec<String> = k.errors.iter().map(|(c, n)| format!("{c}={n}")).collect();
            let _ = writeln!(s, "  {} errors: {}", k.kind, f.join(" "));
            if let Some(e) = &k.first_error {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
    }
    let _ = writeln!(s, "  total      {:.1} good queries/s", a.queries_per_s);
}

/// `n` bytes as B, KiB, MiB or GiB.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn upload_table(s: &mut String, u: &UploadResult) {
    let _ = writeln!(
        s,
        "  upload     service {}{}, max-file-size {}, {} URLs, content type {}",
        u.service,
        if u.discovered { " (discovered)" } else { "" },
        u.max_file_size
            .map(human_bytes)
            .unwrap_or_else(|| "not announced".into()),
        if u.scheme.is_empty() { "no" } else { &u.scheme },
        u.content_type
    );
    if u.phases.is_empty() {
        let _ = writeln!(s, "  (no phase ran: --big-mb 0 and --parallel 0)");
        return;
    }
    let _ = writeln!(
        s,
        "  {:<9} {:<4} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}  server RSS MiB before/max/after (max-before)",
        "phase", "dir", "ok", "MiB/s", "time s", "p50 ms", "p90 ms", "p99 ms", "max ms", "cpu s"
    );
    let mib = |kb: u64| kb as f64 / 1024.0;
    for p in &u.phases {
        for (dir, t) in [("up", &p.upload), ("down", &p.download)] {
            let mem = t
                .memory
                .as_ref()
                .map(|m| {
                    format!(
                        "{:.1}/{:.1}/{:.1} (+{:.1}, {} samples)",
                        mib(m.before_kb),
                        mib(m.max_kb),
                        mib(m.after_kb),
                        mib(m.growth_kb),
                        m.samples
                    )
                })
                .unwrap_or_else(|| "-".into());
            let l = &t.latency;
            let _ = writeln!(
                s,
                "  {:<9} {:<4} {:>7} {:>9.1} {:>8.2} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7}  {}",
                p.name,
                dir,
                format!("{}/{}", t.ok, t.files),
                t.mib_per_s,
                t.duration_s,
                l.p50_ms,
                l.p90_ms,
                l.p99_ms,
                l.max_ms,
                t.server_cpu_s
                    .map(|c| format!("{c:.2}"))
                    .unwrap_or_else(|| "-".into()),
                mem
            );
        }
        let sl = &p.slots;
        let _ = writeln!(
            s,
            "  {:<9} {} file(s) of {}: {}/{} slots (p50 {:.1} ms, p99 {:.1} ms), {}/{} verified byte for byte, {:.2} s in all",
            p.name,
            p.files,
            human_bytes(p.file_bytes),
            sl.granted,
            sl.requested,
            sl.latency.p50_ms,
            sl.latency.p99_ms,
            p.verified,
            p.files,
            p.total_s
        );
        for (what, failures, first) in [
            ("slots", &sl.failures, &sl.first_error),
            ("up", &p.upload.failures, &p.upload.first_error),
            ("down", &p.download.failures, &p.download.first_error),
        ] {
            if failures.is_empty() {
                continue;
            }
            let f: Vec<String> = failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  {:<9} {what} failed: {}", p.name, f.join(" "));
            if let Some(e) = first {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|p| format!("{p:.0}%")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::super::tests::lat;
    use super::*;
    use crate::report::*;

    fn room_ramp() -> RoomRampResult {
        let mut r = RoomRampResult {
            step_secs: 10.0,
            p99_bound_ms: 100.0,
            min_delivery_ratio: 0.99,
            drain_secs: 1.0,
            steps: vec![
                MucStepResult {
                    target_rate: 100.0,
                    sent: 1000,
                    expected_copies: 5000,
                    delivered_copies: 5000,
                    arrived_copies: 5000,
                    latency: lat(&[2_000; 50]),
                    ..MucStepResult::default()
                },
                MucStepResult {
                    target_rate: 200.0,
                    sent: 2000,
                    expected_copies: 10_000,
                    delivered_copies: 8_000,
                    errors: 3,
                    latency: lat(&[2_000; 50]),
                    ..MucStepResult::default()
                },
            ],
            errors_by_condition: [("resource-constraint".to_string(), 3)].into(),
            ..RoomRampResult::default()
        };
        r.finalize();
        r
    }

    #[test]
    fn room_sections_stay_flat_in_json_and_round_trip() {
        let mut join = JoinResult {
            attempted: 20,
            joined: 19,
            failed: 1,
            phase: PhaseStats {
                started_unix_ms: 1_000,
                finished_unix_ms: 3_000,
                latency: lat(&[5_000; 19]),
                server_cpu_s: Some(0.5),
                ..PhaseStats::default()
            },
            ..JoinResult::default()
        };
        join.phase
            .fail("conflict", || "user3 in bench1: conflict".into());
        join.phase.fail("conflict", || "not kept".into());
        join.finalize();
        assert_eq!(join.joins_per_s, 9.5);
        let muc = MucResult {
            layout: RoomLayout {
                service: "conference.localhost".into(),
                rooms: 4,
                room_size: 5,
                ..RoomLayout::default()
            },
            join,
            ramp: room_ramp(),
            ..MucResult::default()
        };
        let v = serde_json::to_value(&muc).unwrap();
        // What bench/compare.sh reads.
        assert_eq!(v["rooms"], 4);
        assert_eq!(v["room_size"], 5);
        assert_eq!(v["join"]["joins_per_s"], 9.5);
        assert_eq!(v["join"]["failures"]["conflict"], 2);
        assert_eq!(v["join"]["first_error"], "user3 in bench1: conflict");
        assert_eq!(v["join"]["server_cpu_s"], 0.5);
        assert_eq!(v["join"]["latency"]["count"], 19);
        assert_eq!(v["steps"][0]["ok"], true);
        assert_eq!(v["steps"][1]["ok"], false);
        assert_eq!(v["saturation"]["rate"], 100.0);
        let note = v["saturation"]["note"].as_str().unwrap();
        assert!(
            note.ends_with("500 delivered copies/s at 100 msg/s sent"),
            "{note}"
        );
        let back: MucResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, muc);
        assert!(muc.join.phase.require(19, 20, 0.9, "joins").is_ok());
        let e = muc.join.phase.require(19, 20, 0.99, "joins").unwrap_err();
        assert!(e.to_string().starts_with("only 19/20 joins"), "{e}");
        assert!(muc.ramp.require(0.85).is_ok());
        assert!(muc.ramp.require(0.9).is_err(), "13000 of 15000 copies");
        assert!(RoomRampResult::default().require(1.0).is_ok(), "no ramp");
    }

    #[test]
    fn muc_light_section_round_trips_and_is_tabulated() {
        let mut creation = CreationResult {
            attempted: 4,
            created: 3,
            failed: 1,
            members: 15,
            notifications_expected: 15,
            notifications_received: 15,
            phase: PhaseStats {
                started_unix_ms: 1_000,
                finished_unix_ms: 1_500,
                latency: lat(&[3_000; 3]),
                ..PhaseStats::default()
            },
            ..CreationResult::default()
        };
        creation.phase.fail("conflict", || {
            "user16 creating bench-x-4: conflict: ".into()
        });
        creation.finalize();
        assert_eq!((creation.rooms_per_s, creation.members_per_s), (6.0, 30.0));
        let r = RunResult {
            scenario: "muc-light".into(),
            users: 20,
            muc_light: Some(MucLightResult {
                protocol: "MUC Light (urn:xmpp:muclight:0)".into(),
                layout: RoomLayout {
                    service: "muclight.localhost".into(),
                    room_prefix: "bench".into(),
                    room_size: 5,
                    rooms: 4,
                    senders: 15,
                    ..RoomLayout::default()
                },
                run_id: "0badcafe".into(),
                creation,
                memory: Some(RoomMemory {
                    server_pid: 7,
                    rss_before_kb: 10_000,
                    rss_sessions_kb: 12_000,
                    rss_rooms_kb: 12_300,
                    kb_per_session: 100.0,
                    kb_per_room: 100.0,
                }),
                ramp: room_ramp(),
            }),
            ..RunResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        let m = &v["muc_light"];
        assert_eq!(m["protocol"], "MUC Light (urn:xmpp:muclight:0)");
        assert_eq!(m["service"], "muclight.localhost");
        assert_eq!(m["creation"]["created"], 3);
        assert_eq!(m["creation"]["failures"]["conflict"], 1);
        assert_eq!(m["memory"]["kb_per_room"], 100.0);
        assert_eq!(m["steps"][1]["errors"], 3);
        assert_eq!(m["errors_by_condition"]["resource-constraint"], 3);
        assert!(v.get("muc").is_none());
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let t = r.table();
        for want in [
            "MUC Light: 4 rooms of 5 at muclight.localhost (15 senders: every member), run id \"0badcafe\"",
            "3 rooms created, 1 failed of 4 in 0.50 s  =>  6 rooms/s, 30 members/s",
            "15/15 affiliation notifications received",
            "create fails conflict=1",
            "100.0 KiB/session, 100.0 KiB/room",
            "errors     from the service: resource-constraint=3",
            "copies/s: delivered copies/s; per copy: latency of every member's copy",
            "saturation 500 delivered copies/s",
        ] {
            assert!(t.contains(want), "{want:?} not in {t}");
        }
    }

    #[test]
    fn pep_section_round_trips_and_is_tabulated() {
        let mut logins = ConnectResult {
            attempted: 20,
            established: 20,
            started_unix_ms: 1_000,
            finished_unix_ms: 1_400,
            ..ConnectResult::default()
        };
        logins.finalize();
        let r = RunResult {
            scenario: "pep".into(),
            users: 20,
            connect: logins.clone(),
            pep: Some(PepResult {
                contacts: 4,
                groups: 4,
                nodes: vec![
                    "urn:xmpp:avatar:metadata".into(),
                    "http://jabber.org/protocol/nick".into(),
                ],
                caps_ver: "abc=".into(),
                quiet_ms: 500,
                window_secs: 30.0,
                caps_warmed_up: true,
                caps_warmup_queries: 1,
                missing_online_first: 1,
                missing_later: 1,
                setup: Some(PepSetup {
                    logins,
                    contacts_expected: 80,
                    contacts_both: 79,
                    subscribes_sent: 40,
                    publish_expected: 40,
                    published: 40,
                    total_s: 1.5,
                    failures: [("subscribe-timeout".to_string(), 1)].into(),
                    first_error: Some("subscribe-timeout: user 3: 1 of 4".into()),
                    ..PepSetup::default()
                }),
                logins: 20,
                expected: 200,
                received: 201,
                received_expected: 198,
                missing: 2,
                duplicates: 3,
                after_window: 1,
                complete_logins: 18,
                expected_per_login: 10.0,
                received_per_login: 10.05,
                bytes_per_login: 4096.0,
                caps_queries: 1,
                latency: lat(&[40_000; 20]),
                duration_s: 2.0,
                notifications_per_s: 100.5,
                server_cpu_ms_per_login: Some(3.5),
                memory: Some(PepMemory {
                    server_pid: 9,
                    rss_before_kb: 1_000,
                    rss_after_kb: 2_000,
                    kb_per_session: 50.0,
                }),
                fanout: Some(PepFanout {
                    node: "urn:xmpp:avatar:metadata".into(),
                    publications: 5,
                    sent: 5,
                    interval_ms: 500,
                    max_receivers: 5,
                    expected: 25,
                    delivered: 24,
                    complete: 4,
                    latency: lat(&[2_000; 24]),
                    last_latency: lat(&[3_000; 4]),
                    ..PepFanout::default()
                }),
                ..PepResult::default()
            }),
            ..RunResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        let p = &v["pep"];
        assert_eq!(p["setup"]["contacts_both"], 79);
        assert_eq!(p["setup"]["failures"]["subscribe-timeout"], 1);
        assert_eq!(p["received_expected"], 198);
        assert_eq!(p["latency"]["count"], 20);
        assert_eq!(p["memory"]["kb_per_session"], 50.0);
        assert_eq!(p["fanout"]["last_latency"]["count"], 4);
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let t = r.table();
        for want in [
            "4 contacts per user (4 groups), 2 node(s): urn:xmpp:avatar:metadata, http://jabber.org/protocol/nick; caps ver abc=",
            "79/80 contacts mutually subscribed",
            "40/40 items published",
            "prep fails subscribe-timeout=1",
            "20 logins all at once, caps known to the server (warm-up: 1 queries); a window closes 500 ms after the last expected notification, or 30 s after the presence",
            "10.1 per login (10.0 expected): 198/200 expected received, 2 missing (1 of publishers online first, 1 of later ones), 3 duplicates, 0 unexpected, 1 after the window; 18/20 logins complete",
            "p50 40.0 ms",
            "4.0 KiB received per login after binding",
            "server CPU 3.50 ms/login",
            "1000 KiB -> 2000 KiB for 20 sessions  =>  50.0 KiB/session",
            "5/5 publications to urn:xmpp:avatar:metadata (one every 500 ms, up to 5 receivers each, 0 errors): 24/25 notifications delivered, 0 duplicates, 4/5 publications complete",
            "to each contact p50 2.0 ms  p99 2.0 ms  max 2.0 ms; to the last contact p50 3.0 ms  p99 3.0 ms  max 3.0 ms",
        ] {
            assert!(t.contains(want), "{want:?} not in {t}");
        }
        assert!(serde_json::to_value(RunResult::default())
            .unwrap()
            .get("pep")
            .is_none());
    }

    #[test]
    fn upload_section_round_trips_and_is_tabulated() {
        let transfer = |ok: u64, files: u64| TransferStats {
            files,
            ok,
            bytes: ok * 1024,
            duration_s: 0.5,
            mib_per_s: 12.5,
            latency: lat(&[1_000, 2_000]),
            failures: if ok < files {
                [("http-413".to_string(), files - ok)].into()
            } else {
                BTreeMap::new()
            },
            first_error: (ok < files).then(|| "http-413: HTTP 413 Payload Too Large".into()),
            server_cpu_s: Some(0.25),
            client_cpu_s: Some(0.5),
            memory: Some(RssWindow {
                before_kb: 20_480,
                max_kb: 22_528,
                after_kb: 21_504,
                growth_kb: 2_048,
                samples: 11,
            }),
        };
        let r = RunResult {
            scenario: "upload".into(),
            upload: Some(UploadResult {
                service: "upload.localhost".into(),
                discovered: true,
                max_file_size: Some(100 << 20),
                content_type: "application/octet-stream".into(),
                scheme: "https".into(),
                server_pid: Some(42),
                sample_ms: 50,
                phases: vec![UploadPhase {
                    name: "parallel".into(),
                    files: 3,
                    file_bytes: 1024,
                    slots: SlotStats {
                        requested: 3,
                        granted: 3,
                        latency: lat(&[500]),
                        ..SlotStats::default()
                    },
                    upload: transfer(2, 3),
                    download: transfer(2, 2),
                    verified: 2,
                    total_s: 1.5,
                }],
            }),
            ..RunResult::default()
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RunResult>(&json).unwrap(), r);
        let t = r.table();
        assert!(
            t.contains("service upload.localhost (discovered), max-file-size 100 MiB, https URLs"),
            "{t}"
        );
        assert!(t.contains("20.0/22.0/21.0 (+2.0, 11 samples)"), "{t}");
        assert!(t.contains("3 file(s) of 1 KiB: 3/3 slots"), "{t}");
        assert!(t.contains("2/3 verified byte for byte"), "{t}");
        assert!(t.contains("up failed: http-413=1"), "{t}");
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100 << 20), "100 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
    }

    #[test]
    fn archive_section_round_trips_and_is_tabulated() {
        let r = RunResult {
            scenario: "archive".into(),
            archive: Some(ArchiveResult {
                page_size: 50,
                duration_s: 10.0,
                users: 2,
                fill: Some(FillResult {
                    per_user: 100,
                    partners: 2,
                    sent: 200,
                    delivered: 150,
                    duration_s: 2.0,
                    delivered_per_s: 75.0,
                    complete: false,
                }),
                kinds: vec![QueryKindResult {
                    kind: "by-id".into(),
                    queries: 12,
                    ok: 10,
                    errors: [("timeout".to_string(), 2)].into(),
                    first_error: Some("timeout: no <fin/> in time".into()),
                    results: 500,
                    queries_per_s: 1.0,
                    latency: lat(&[4_000; 10]),
                    ..QueryKindResult::default()
                }],
                queries_per_s: 1.0,
                ..ArchiveResult::default()
            }),
            ..RunResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["archive"]["kinds"][0]["latency"]["count"], 10);
        assert_eq!(v["archive"]["fill"]["complete"], false);
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.archive.as_ref().unwrap().kinds[0].failed(), 2);
        let t = r.table();
        assert!(t.contains("150 of 200 messages delivered"), "{t}");
        assert!(t.contains("INCOMPLETE"), "{t}");
        assert!(t.contains("by-id errors: timeout=2"), "{t}");
        let row = t
            .lines()
            .find(|l| l.trim_start().starts_with("by-id "))
            .unwrap();
        assert!(row.contains("     4.0"), "p50 4 ms in {row}");
        // Other scenarios do not carry the section.
        let o = serde_json::to_value(RunResult::default()).unwrap();
        assert!(o.get("archive").is_none());
    }
}
