// verify-go --headers FILE --body FILE --key FILE [--now-ms N]
//
// headers FILE: JSON object, header name -> value; body FILE: the raw body bytes;
// key FILE: the PEM public key or the whpk_... text.
// Exit 0 "genuine: <scheme> signature", 1 "refused: <reason>", 2 usage error.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"time"

	"example.com/webhookverify"
)

const usage = "usage: verify-go --headers FILE --body FILE --key FILE [--now-ms N]"

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "error: "+format+"\n%s\n", append(args, usage)...)
	os.Exit(2)
}

func main() {
	flags := flag.NewFlagSet("verify-go", flag.ContinueOnError)
	flags.Usage = func() { fmt.Fprintln(flags.Output(), usage) }
	headersFile := flags.String("headers", "", "JSON object of header name -> value")
	bodyFile := flags.String("body", "", "the raw body bytes")
	keyFile := flags.String("key", "", "the PEM public key or whpk_... text")
	nowText := flags.String("now-ms", "", "the receiver's clock, unix milliseconds")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2) // flag printed the error and the usage
	}
	if flags.NArg() > 0 {
		fail("unexpected argument %q", flags.Arg(0))
	}
	given := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range []string{"headers", "body", "key"} {
		if !given[name] {
			fail("--%s is required", name)
		}
	}

	headerJSON, err := os.ReadFile(*headersFile)
	if err != nil {
		fail("%v", err)
	}
	var fields map[string]string
	if err := json.Unmarshal(headerJSON, &fields); err != nil || fields == nil {
		fail("the headers file must be a JSON object of header name -> string value")
	}
	header := http.Header{}
	for name, value := range fields {
		header[name] = append(header[name], value) // names kept as written
	}
	body, err := os.ReadFile(*bodyFile) // the exact bytes
	if err != nil {
		fail("%v", err)
	}
	keyText, err := os.ReadFile(*keyFile)
	if err != nil {
		fail("%v", err)
	}
	key, err := webhookverify.ParsePublicKey(string(keyText))
	if err != nil {
		fail("%v", err)
	}
	now := time.Now()
	if given["now-ms"] {
		if !regexp.MustCompile(`^-?[0-9]{1,16}$`).MatchString(*nowText) {
			fail("--now-ms must be an integer")
		}
		ms, _ := strconv.ParseInt(*nowText, 10, 64)
		now = time.UnixMilli(ms)
	}

	result, err := key.Verify(header, body, now)
	if err != nil {
		fmt.Printf("refused: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("genuine: %s signature\n", result.Scheme)
}
