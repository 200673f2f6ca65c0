use super::*;

#[test]
fn written_out_the_rules_read_fields_a_schema_may_lack_untyped() {
    // A modern XR's schema has no spec.resourceRefs, a legacy one's no
    // spec.crossplane: the API server's type check warns of a typed read of
    // either in a validation, and the policies declare no variables to hide
    // them in (kubernetes/kubernetes#135757), so both are read through dyn().
    let settings = CompileSettings::default();
    let typed = |e: &str| {
        let mut e = e
            .replace("dyn(oldObject).spec.", "")
            .replace("dyn(object).spec.", "");
        // What the messages say by name, in quotes, is not a read.
        for said in ["'spec.crossplane.resourceRefs'", "'spec.resourceRefs'"] {
            e = e.replace(said, "");
        }
        ["spec.crossplane", "spec.resourceRef"]
            .into_iter()
            .filter(|f| e.contains(f))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
        for shape in [Shape::CompositeResource, Shape::Claim, Shape::Other] {
            let p = compile_cel(mode, shape, &settings);
            for e in [&p.validation, &p.message_expression, &p.decision_expression] {
                let out = inline_variables(e, &p.variables);
                assert!(!out.contains("variables."), "{mode} {shape:?}: {out}");
                assert_eq!(typed(&out), Vec::<String>::new(), "{mode} {shape:?}: {out}");
            }
            let u = compile_update_cel(mode, shape, &settings);
            for v in &u.validations {
                for e in [&v.expression, &v.message_expression] {
                    let out = inline_variables(e, &u.variables);
                    assert!(!out.contains("variables."), "{mode} {shape:?}: {out}");
                    assert_eq!(typed(&out), Vec::<String>::new(), "{mode} {shape:?}: {out}");
                }
            }
        }
    }
}

#[test]
fn variables_are_written_out_for_match_conditions() {
    let vars = [
        var("a", "request.x"),
        var("ab", "variables.a == 1"),
        var("a_b", "variables.ab && variables.a"),
    ];
    let cases = [
        ("variables.a", "(request.x)"),
        ("variables.ab", "((request.x) == 1)"),
        (
            "!variables.a_b || f(variables.a)",
            "!(((request.x) == 1) && (request.x)) || f((request.x))",
        ),
        ("variables.unknown", "variables.unknown"),
        ("no variables", "no variables"),
        // Literals and longer identifiers are left alone.
        (
            "variables.a == 'variables.a' || \"x\\\" variables.ab\" == myvariables.a",
            "(request.x) == 'variables.a' || \"x\\\" variables.ab\" == myvariables.a",
        ),
        (
            "'it\\'s variables.a' + variables.a",
            "'it\\'s variables.a' + (request.x)",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(inline_variables(input, &vars), want, "{input}");
    }
}

#[test]
fn a_username_that_reads_like_a_variable_is_not_rewritten() {
    let settings = CompileSettings {
        gc_service_account_user: "system:serviceaccount:variables.policy:gc".into(),
        ..CompileSettings::default()
    };
    let p = compile_cel(Mode::Refuse, Shape::CompositeResource, &settings);
    assert!(
        p.refusal_condition.contains(&cel_string_literal(
            "system:serviceaccount:variables.policy:gc"
        )),
        "{}",
        p.refusal_condition
    );
}

#[test]
fn the_garbage_collector_is_checked_first_and_the_rest_in_rule_order() {
    for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
        for shape in [Shape::CompositeResource, Shape::Claim, Shape::Other] {
            let p = compile_cel(mode, shape, &CompileSettings::default());
            let rest: Vec<String> = rules(mode, shape)
                .into_iter()
                .filter(|(r, _)| *r != AllowReason::GarbageCollector)
                .map(|(_, c)| wrap(c))
                .collect();
            let want = std::iter::once("variables.isGarbageCollector".to_string())
                .chain(rest)
                .collect::<Vec<_>>()
                .join(" || ");
            assert_eq!(p.validation, want, "{mode} {shape:?}");
            // The audit annotation still names the rules in the decision
            // table's order.
            if shape != Shape::Claim {
                assert!(
                    p.decision_expression
                        .starts_with("variables.foregroundAsked ?"),
                    "{}",
                    p.decision_expression
                );
            }
        }
    }
}

#[test]
fn the_refusal_condition_is_the_validation_negated_without_variables() {
    for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
        for shape in [Shape::CompositeResource, Shape::Other] {
            let p = compile_cel(mode, shape, &CompileSettings::default());
            assert!(
                !p.refusal_condition.contains("variables."),
                "{mode} {shape:?}"
            );
            assert_eq!(
                p.refusal_condition,
                format!("!({})", inline_variables(&p.validation, &p.variables))
            );
            // Balanced, so the negation covers the whole rule.
            let depth = p.refusal_condition.chars().try_fold(0i32, |d, c| {
                let d = d + i32::from(c == '(') - i32::from(c == ')');
                (d >= 0).then_some(d)
            });
            assert_eq!(depth, Some(0), "{mode} {shape:?}");
        }
    }
}

/// Decodes one CEL double-quoted literal at the start of `text`, returning
/// the value and the rest. Written from the CEL spec's escape list, and
/// strict: it rejects anything a CEL lexer would not accept in a literal.
fn lex_literal(text: &str) -> Result<(String, &str), String> {
    let mut chars = text.char_indices();
    if chars.next().map(|(_, c)| c) != Some('"') {
        return Err("does not start with a quote".into());
    }
    let mut value = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &text[i + 1..])),
            '\n' | '\r' => return Err("raw line break".into()),
            '\\' => {
                let (_, e) = chars.next().ok_or("dangling backslash")?;
                let hex = |n: usize, chars: &mut std::str::CharIndices| -> Result<char, String> {
                    let digits: String = (0..n)
                        .filter_map(|_| chars.next().map(|(_, c)| c))
                        .collect();
                    let code = u32::from_str_radix(&digits, 16).map_err(|e| e.to_string())?;
                    char::from_u32(code).ok_or_else(|| "not a scalar value".to_string())
                };
                value.push(match e {
                    '\\' => '\\',
                    '"' => '"',
                    '\'' => '\'',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'u' => hex(4, &mut chars)?,
                    'U' => hex(8, &mut chars)?,
                    other => return Err(format!("unknown escape \\{other}")),
                });
            }
            c => value.push(c),
        }
    }
    Err("unterminated".into())
}

#[test]
fn literals_round_trip_and_cannot_break_out() {
    let hostile = [
        "system:serviceaccount:kube-system:generic-garbage-collector",
        "",
        "a' || true || '",
        "a\" || true || \"",
        "\"",
        "'",
        "\\",
        "\\\"",
        "ends with backslash\\",
        "line\nbreak",
        "carriage\rreturn",
        "nul\u{0}byte",
        "bell\u{7}del\u{7f}",
        "tab\there",
        "é ü 日本 🦀",
        "\u{2028}\u{2029}",
        "${x} `backtick` {{ }}",
        "\") || true || (\"",
    ];
    for input in hostile {
        let lit = cel_string_literal(input);
        assert!(lit.chars().all(|c| (' '..='~').contains(&c)), "{lit}");
        let (value, rest) = lex_literal(&lit).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(value, input);
        assert_eq!(rest, "", "{input:?} leaked out of its literal");
        // Inside an expression, the literal is still one token.
        let expr = format!("variables.username == {lit} && false");
        let after = expr.strip_prefix("variables.username == ").unwrap();
        let (_, tail) = lex_literal(after).unwrap();
        assert_eq!(tail, " && false");
    }
    assert_eq!(cel_string_literal("a'b\"c\\d\n"), r#""a\'b\"c\\d\n""#);
    assert_eq!(
        cel_string_literal("\u{0}é🦀"),
        r#""\u0000\u00e9\U0001f980""#
    );
}

fn all_text(p: &CelPolicy) -> String {
    let mut s = String::new();
    for v in &p.variables {
        s.push_str(&v.expression);
        s.push('\n');
    }
    for e in [
        &p.validation,
        &p.message_expression,
        &p.message,
        &p.decision_expression,
    ] {
        s.push_str(e);
        s.push('\n');
    }
    s
}

fn used_variables(expression: &str) -> Vec<String> {
    expression
        .split("variables.")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

fn var_names(p: &CelPolicy) -> Vec<&str> {
    p.variables.iter().map(|v| v.name).collect()
}

#[test]
fn variants_differ_as_expected() {
    let s = CompileSettings::default();
    // (mode, shape, has nothingToCascade, has convertHeld)
    let cases = [
        (Mode::Refuse, Shape::CompositeResource, true, false),
        (Mode::Refuse, Shape::Other, false, false),
        (Mode::Warn, Shape::CompositeResource, true, false),
        (Mode::Convert, Shape::CompositeResource, true, true),
        (Mode::Convert, Shape::Other, false, true),
    ];
    for (mode, shape, nothing, convert) in cases {
        // Crossplane's delete of a held object: every mode that refuses
        // or warns (Convert lets anyone's through).
        let crossplane = !convert;
        let p = compile_cel(mode, shape, &s);
        let names = var_names(&p);
        assert_eq!(
            names.contains(&"nothingToCascade"),
            nothing,
            "{mode} {shape:?}"
        );
        assert_eq!(names.contains(&"convertHeld"), convert, "{mode} {shape:?}");
        assert_eq!(p.validation.contains("variables.nothingToCascade"), nothing);
        assert_eq!(p.validation.contains("variables.convertHeld"), convert);
        assert_eq!(p.decision_expression.contains("NothingToCascade"), nothing);
        assert_eq!(p.decision_expression.contains("ConvertHeld"), convert);
        assert_eq!(names.contains(&"crossplaneHeld"), crossplane);
        assert_eq!(
            p.validation.contains("variables.crossplaneHeld"),
            crossplane
        );
        assert_eq!(p.decision_expression.contains("CrossplaneHeld"), crossplane);
        assert_eq!(all_text(&p).contains("resourceRefs"), nothing);
        for always in [
            "foregroundAsked",
            "noPolicy",
            "inForeground",
            "isGarbageCollector",
            "breakGlass",
        ] {
            assert!(names.contains(&always), "{always}");
            assert!(
                p.validation.contains(&format!("variables.{always}")),
                "{always}"
            );
        }
        // Every variable an expression uses is declared before it.
        for (i, v) in p.variables.iter().enumerate() {
            for used in used_variables(&v.expression) {
                assert!(
                    names[..i].contains(&used.as_str()),
                    "{} uses {used} before it is declared",
                    v.name
                );
            }
        }
        for e in [&p.validation, &p.message_expression, &p.decision_expression] {
            for used in used_variables(e) {
                assert!(names.contains(&used.as_str()), "{used} is not declared");
            }
        }
        // The API server requires variable names to be CEL identifiers,
        // and CEL reserves some ordinary words (`namespace` among them).
        const RESERVED: [&str; 21] = [
            "as",
            "break",
            "const",
            "continue",
            "else",
            "false",
            "for",
            "function",
            "if",
            "import",
            "in",
            "let",
            "loop",
            "package",
            "namespace",
            "null",
            "return",
            "true",
            "var",
            "void",
            "while",
        ];
        for name in &names {
            assert!(!RESERVED.contains(name), "{name} is reserved in CEL");
            assert!(
                name.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            );
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        }
        assert_eq!(p.reason, "Forbidden");
        assert!(!p.message.contains('\n') && !p.message_expression.contains('\n'));
    }
    let refuse = compile_cel(Mode::Refuse, Shape::CompositeResource, &s);
    let warn = compile_cel(Mode::Warn, Shape::CompositeResource, &s);
    assert_eq!(refuse.variables, warn.variables);
    assert_eq!(refuse.validation, warn.validation);
    assert!(refuse.message_expression.contains("refused"));
    assert!(warn.message_expression.contains("warning"));
    assert!(refuse.message_expression.contains(BREAK_GLASS_ANNOTATION));
    assert!(
        compile_cel(Mode::Refuse, Shape::Other, &s)
            .message_expression
            .contains("the objects it owns")
    );
}

#[test]
fn rules_follow_the_decision_order() {
    let cases = [
        (Mode::Convert, Shape::CompositeResource),
        (Mode::Refuse, Shape::Claim),
    ];
    for (mode, shape) in cases {
        let p = compile_cel(mode, shape, &CompileSettings::default());
        let ours: Vec<AllowReason> = rules(mode, shape).into_iter().map(|(r, _)| r).collect();
        let positions: Vec<usize> = AllowReason::ORDER
            .iter()
            .filter(|r| ours.contains(r))
            .map(|r| {
                p.decision_expression
                    .find(&format!("'allowed: {}'", r.as_str()))
                    .unwrap_or_else(|| panic!("{mode} {shape:?}: {r:?} not in the expression"))
            })
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
        assert!(
            p.decision_expression
                .ends_with("'refused: ' + variables.sent")
        );
    }
    // Which rules a claim has: its own propagation counts for nothing,
    // except that a delete of a claim already being deleted, sending
    // none, changes nothing.
    let claim: Vec<AllowReason> = rules(Mode::Refuse, Shape::Claim)
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(
        claim,
        [
            AllowReason::AlreadyDeleting,
            AllowReason::NothingToCascade,
            AllowReason::CompositeDeletedInForeground,
            AllowReason::GarbageCollector,
            AllowReason::BreakGlass,
        ]
    );
}

#[test]
fn only_the_gc_usernames_are_embedded() {
    let settings = CompileSettings {
        gc_service_account_user: "gc' || true || '\"\\\n\u{0}".into(),
        gc_controller_manager_user: "kcm-🦀".into(),
        ..CompileSettings::default()
    };
    let p = compile_cel(Mode::Refuse, Shape::CompositeResource, &settings);
    let text = all_text(&p);
    assert!(text.contains(&cel_string_literal(&settings.gc_service_account_user)));
    assert!(text.contains(&cel_string_literal(&settings.gc_controller_manager_user)));
    assert!(!text.contains("gc' || true"));

    // Remove the two literals; what is left is fixed text that does not
    // depend on any setting, so nothing else can have been embedded.
    let strip = |p: &CelPolicy, s: &CompileSettings| {
        all_text(p)
            .replace(&cel_string_literal(&s.gc_service_account_user), "SA")
            .replace(&cel_string_literal(&s.gc_controller_manager_user), "KCM")
    };
    let defaults = CompileSettings::default();
    assert_eq!(
        strip(&p, &settings),
        strip(
            &compile_cel(Mode::Refuse, Shape::CompositeResource, &defaults),
            &defaults
        )
    );
    // No kind, group or resource name appears: they come from the request.
    for word in ["modelplane", "InferenceCluster", "inferenceclusters"] {
        assert!(!text.contains(word));
    }
}

#[test]
fn empty_gc_identities_are_left_out() {
    let cases = [
        (
            ("sa", "kcm"),
            "variables.username == \"sa\" || (variables.username == \"kcm\" && variables.uidPrecondition)",
        ),
        (("sa", ""), "variables.username == \"sa\""),
        (
            ("", "kcm"),
            "(variables.username == \"kcm\" && variables.uidPrecondition)",
        ),
        (("", ""), "false"),
    ];
    for ((sa, kcm), want) in cases {
        let settings = CompileSettings {
            gc_service_account_user: sa.into(),
            gc_controller_manager_user: kcm.into(),
            ..CompileSettings::default()
        };
        assert_eq!(garbage_collector_expression(&settings), want);
    }
}

#[test]
fn update_rules_by_shape_and_mode() {
    let settings = CompileSettings::default();
    for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
        for shape in [Shape::CompositeResource, Shape::Other] {
            let p = compile_update_cel(mode, shape, &settings);
            let xr = shape == Shape::CompositeResource;
            let label = format!("{mode} {shape:?}");
            // The match condition stands alone, and checks who asks
            // before any list is compared.
            assert!(!p.match_condition.contains("variables."), "{label}");
            assert!(
                p.match_condition
                    .starts_with("(!(request.userInfo.?username.orValue('') in [")
            );
            let depth = p.match_condition.chars().try_fold(0i32, |d, c| {
                let d = d + i32::from(c == '(') - i32::from(c == ')');
                (d >= 0).then_some(d)
            });
            assert_eq!(depth, Some(0), "{label}");
            assert_eq!(p.match_condition.contains("resourceRefs"), xr, "{label}");
            if xr {
                let crossplane = p.match_condition.find("crossplane-system").unwrap();
                let refs = p.match_condition.find(".exists(").unwrap();
                assert!(crossplane < refs, "{label}");
            }
            assert_eq!(p.validations.len(), if xr { 2 } else { 1 }, "{label}");
            let names: Vec<&str> = p.variables.iter().map(|v| v.name).collect();
            for (i, v) in p.variables.iter().enumerate() {
                for used in used_variables(&v.expression) {
                    assert!(
                        names[..i].contains(&used.as_str()),
                        "{} uses {used}",
                        v.name
                    );
                }
            }
            for v in &p.validations {
                for e in [&v.expression, &v.message_expression] {
                    for used in used_variables(e) {
                        assert!(names.contains(&used.as_str()), "{used} is not declared");
                    }
                }
                assert!(!v.message.contains('\n') && !v.message_expression.contains('\n'));
                let lead = if mode == Mode::Warn {
                    "'cascade-guard warning: removing"
                } else {
                    "'cascade-guard refused to remove"
                };
                assert!(v.message_expression.starts_with(lead), "{label}");
                // The break-glass command pastes into a shell as it is.
                assert!(
                    v.message_expression
                        .contains(&format!("{BREAK_GLASS_ANNOTATION}=\\\"<why>\\\"")),
                    "{}",
                    v.message_expression
                );
            }
            assert_eq!(p.reason, "Forbidden");
        }
    }
}

/// Break-glass asks the API server's authorizer, unless told not to; the
/// refusal says when the annotation was there but did not count.
#[test]
fn break_glass_needs_the_permission_unless_told_otherwise() {
    let strict = CompileSettings::default();
    let lax = CompileSettings {
        break_glass_needs_permission: false,
        ..CompileSettings::default()
    };
    let asks =
        "authorizer.group('cascade-guard.dev').resource('breakglass').check('use').allowed()";
    let variable = |vars: &[CelVariable], name: &str| {
        vars.iter()
            .find(|v| v.name == name)
            .map(|v| v.expression.clone())
            .unwrap_or_default()
    };
    for (settings, needs) in [(&strict, true), (&lax, false)] {
        let delete = compile_cel(Mode::Refuse, Shape::CompositeResource, settings);
        assert_eq!(
            variable(&delete.variables, "breakGlass").contains(asks),
            needs
        );
        assert_eq!(delete.refusal_condition.contains(asks), needs);
        assert!(
            delete
                .message_expression
                .contains("may not use break-glass")
        );
        let update = compile_update_cel(Mode::Refuse, Shape::CompositeResource, settings);
        assert_eq!(
            variable(&update.variables, "breakGlass").contains(asks),
            needs
        );
    }
}

#[test]
fn update_users_are_embedded_as_literals_and_empty_ones_never_match() {
    let hostile = CompileSettings {
        gc_service_account_user: "variables.x\" || true || \"".into(),
        gc_controller_manager_user: String::new(),
        crossplane_user: "cp' || true || '".into(),
        controller_user: "cg-🦀".into(),
        break_glass_needs_permission: true,
        set_name: None,
    };
    let p = compile_update_cel(Mode::Refuse, Shape::CompositeResource, &hostile);
    let lit = |s: &str| cel_string_literal(s);
    assert!(p.match_condition.contains(&format!(
        "request.userInfo.?username.orValue('') in [{}, {}]",
        lit(&hostile.gc_service_account_user),
        lit(&hostile.controller_user)
    )));
    assert!(p.match_condition.contains(&format!(
        "request.userInfo.?username.orValue('') in [{}]",
        lit(&hostile.crossplane_user)
    )));
    assert!(!p.match_condition.contains("cp' || true"));
    let nobody = CompileSettings {
        gc_service_account_user: String::new(),
        gc_controller_manager_user: String::new(),
        crossplane_user: String::new(),
        controller_user: String::new(),
        break_glass_needs_permission: true,
        set_name: None,
    };
    let p = compile_update_cel(Mode::Refuse, Shape::CompositeResource, &nobody);
    assert!(p.match_condition.starts_with("(!(false) && "));
    assert!(p.match_condition.contains("|| (!(false) && "));
}

#[test]
fn delete_refusals_say_what_the_delete_would_do() {
    let p = compile_cel(
        Mode::Refuse,
        Shape::CompositeResource,
        &CompileSettings::default(),
    );
    let m = &p.message_expression;
    // Mid-cascade: nothing to do but wait; Orphan: left behind; else: removed first.
    let cut = m
        .find("variables.inForeground ? \"it is already being deleted")
        .unwrap();
    let orphan = m
        .find("variables.orphaning ? \"it would leave its composed resources behind")
        .unwrap();
    let first = m
        .find("\"it would remove it before its composed resources are gone")
        .unwrap();
    assert!(cut < orphan && orphan < first, "{m}");
    assert!(m.contains("cascade-guard trace \" + variables.target"));
    assert!(m.contains("cascade-guard plan \" + variables.target"));
    assert!(
        m.contains(&format!("{BREAK_GLASS_ANNOTATION}=\\\"<why>\\\"")),
        "{m}"
    );
    assert!(!m.contains("=<reason>"));
}
